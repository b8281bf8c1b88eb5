"""``flare-l2evict check``: the preflight an operator runs before turning the plugin on.

It runs the runtime's own steps without installing anything: the seam proof,
stock's buffer (measured on CUDA), the window, the source choice (from
safetensors headers, as the plan does) and the credit. It prints one line per
step, or with ``--json`` one object holding every figure.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from typing import TYPE_CHECKING, Any

from .._credit import Credit, credit
from .._errors import InstallError
from .._seam import b12x_origin, fork_function, measure_stock_buffer, prove_seam, versions
from .._seam_table import FORK
from .._settings import load_deployment_config, settings_from_config
from .._text import shown
from .._window import device_l2_bytes, stock_buffer_bytes

if TYPE_CHECKING:
    import torch

    from ._profiles import DeviceProfile


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_check(
    args: argparse.Namespace,
    profile: DeviceProfile,
    device: torch.device,
    device_reason: str = "--device",
) -> int:
    """Print the preflight; 0 if the plugin would install and credit, 1 if it would fall back.

    ``device_reason`` says why this device was checked (given, or the default
    on this machine); the first line of the report says it. With
    ``args.json`` the report is one JSON object instead of lines.
    """
    # Every input is read before the first line, so bad input is one line on
    # stderr and nothing on stdout; then each step prints as it finishes, so a
    # step that hangs or crashes on a GPU still shows the ones before it.
    config: dict[str, Any] = load_deployment_config(args.config) if args.config else {}
    settings = settings_from_config(config)
    headers = None
    if args.checkpoint:
        from ._headers import read_checkpoint

        headers = read_checkpoint(args.checkpoint)
    figures: dict[str, Any] = {"device": str(device), "device_reason": device_reason}
    lines = _Lines(quiet=args.json)
    lines.append(f"flare-l2evict check on {device} ({device_reason})")
    _, flashinfer = versions()
    origin = b12x_origin()
    figures["versions"] = {"torch": _version("torch"), "flashinfer-python": flashinfer}
    figures["b12x"] = {
        "origin": origin.describe(),
        "distribution": origin.distribution,
        "version": origin.version,
        "path": origin.path,
    }
    where = f" ({shown(origin.path)})" if origin.path else ""
    lines.append(
        f"torch {_version('torch') or 'not installed'}; b12x: {shown(origin.describe())}{where}; "
        f"flashinfer-python {flashinfer or 'not installed'}"
    )
    if device.type == "cuda":
        l2 = device_l2_bytes(device)
        l2_source = "read from the device"
    else:
        l2 = profile.l2_cache_bytes
        l2_source = f"profile {profile.name}"
    figures |= {"l2_cache_bytes": l2, "l2_source": l2_source, "race_jobs": profile.race_jobs}
    lines.append(f"device: {device} (L2 {l2:,} bytes, {l2_source})")
    blocked: str | None = None
    stock_bytes = stock_buffer_bytes(l2)
    measured = False
    seam: dict[str, Any]
    if fork_function() is not None:
        seam = {"verdict": "installs", "via": f"fork {FORK.function}", "reason": None}
        lines.append(f"seam: the fork's {FORK.dotted} (formula buffer)")
    else:
        try:
            proof = prove_seam()
        except InstallError as error:
            seam = {"verdict": "falls back", "via": None, "reason": str(error)}
            lines.append(f"seam: falls back: {shown(str(error), 600)}")
            blocked = str(error)
        else:
            seam = {
                "verdict": "installs",
                "via": f"stock {proof.row.function}",
                "extra_bindings": len(proof.bindings),
                "reason": None,
            }
            extra = f"; {len(proof.bindings)} extra bindings redirected" if proof.bindings else ""
            lines.append(f"seam: installs (stock b12x's {proof.row.function}{extra})")
            stock = measure_stock_buffer(proof.original, device, l2)
            stock_bytes, measured = stock.nbytes, stock.measured
    figures["seam"] = seam
    how = "measured" if measured else "formula max(2 x L2, 64 MiB)"
    figures["stock_buffer"] = {"bytes": stock_bytes, "measured": measured}
    lines.append(f"stock buffer per race job: {stock_bytes:,} bytes ({how})")
    window = settings.window_bytes(l2)
    figures["window"] = {"bytes": window, "setting": settings.window}
    lines.append(f"window: {window:,} bytes ({settings.window})")
    storage: dict[str, Any] = {"checked": headers is not None}
    if headers is not None:
        from ._plan import decide_shard, shard_of

        decision = decide_shard(
            shard_of(headers),
            settings,
            l2_cache_bytes=l2,
            race_jobs=profile.race_jobs,
            stock_buffer_bytes=stock_bytes,
            blocked=blocked,
        )
        granted = decision.credit
        storage |= {
            "read_bytes": decision.read_bytes,
            "tensors": [{"name": s.name, "bytes": s.storage_bytes} for s in decision.sources],
        }
        if decision.sources:
            listed = ", ".join(
                f"{shown(s.name, 120)} ({s.storage_bytes:,} bytes)" for s in decision.sources
            )
            lines.append(f"storage read: {listed}")
        else:
            why = decision.choice.shortfall or granted.reason or ""
            lines.append(f"storage read: none ({shown(why, 600)})")
    else:
        lines.append("storage read: not checked (pass this rank's checkpoint files to check it)")
        if not settings.enabled:
            blocked = "disabled by config (plugins.l2evict.enabled = false)"
        # No checkpoint: the verdict is about this machine, as if the window were covered.
        granted = (
            Credit(0, blocked)
            if blocked is not None
            else credit(
                installable=True,
                race_jobs=profile.race_jobs,
                stock_buffer_bytes=stock_bytes,
                window_bytes=window,
                read_bytes=window,
            )
        )
    figures["storage_read"] = storage
    if granted.nbytes == 0:
        reason = granted.reason or "nothing to credit"
        figures |= {"verdict": "falls back", "credit_bytes": 0, "reason": reason}
        lines.append(f"verdict: falls back, credit 0 bytes: {shown(reason, 600)}")
        code = 1
    else:
        figures |= {"verdict": "installs", "credit_bytes": granted.nbytes, "reason": None}
        lines.append(
            f"verdict: installs; credit {granted.nbytes:,} bytes "
            f"({profile.race_jobs} race jobs x {stock_bytes:,} bytes, "
            "less the eviction's own outputs and kernel code)"
        )
        code = 0
    figures["exit_code"] = code
    if args.json:
        print(json.dumps(figures, indent=2))
    return code


class _Lines:
    """The report's lines, printed as they come unless the report is JSON."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet

    def append(self, line: str) -> None:
        if not self.quiet:
            print(line, flush=True)
