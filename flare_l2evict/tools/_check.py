"""``flare-l2evict check``: the preflight an operator runs before turning the plugin on.

It runs the runtime's own steps without installing anything: the seam proof,
stock's buffer (measured on CUDA), the window, the source choice (from
safetensors headers, as the plan does) and the credit.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from typing import TYPE_CHECKING, Any

from .._credit import credit
from .._errors import InstallError
from .._seam import fork_function, measure_stock_buffer, prove_seam, versions
from .._settings import load_deployment_config, settings_from_config
from .._window import device_l2_bytes, stock_buffer_bytes

if TYPE_CHECKING:
    import torch

    from ._profiles import DeviceProfile


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run_check(args: argparse.Namespace, profile: DeviceProfile, device: torch.device) -> int:
    """Print the preflight; 0 if the plugin would install and credit, 1 if it would fall back."""
    config: dict[str, Any] = load_deployment_config(args.config) if args.config else {}
    settings = settings_from_config(config)
    b12x, flashinfer = versions()
    print(
        f"torch {_version('torch')}; b12x {b12x or 'not installed'}; "
        f"flashinfer-python {flashinfer or 'not installed'}"
    )
    if device.type == "cuda":
        l2 = device_l2_bytes(device)
        print(f"device: {device} (L2 {l2:,} bytes, read from the device)")
    else:
        l2 = profile.l2_cache_bytes
        print(f"device: {device} (L2 {l2:,} bytes, profile {profile.name})")
    blocked: str | None = None
    stock_bytes = stock_buffer_bytes(l2)
    measured = False
    if fork_function() is not None:
        print("seam: the fork's b12x.comm.pcie.use_startup_eviction (formula buffer)")
    else:
        try:
            proof = prove_seam()
        except InstallError as error:
            print(f"seam: falls back: {error}")
            blocked = str(error)
        else:
            extra = f"; {len(proof.bindings)} extra bindings redirected" if proof.bindings else ""
            print(f"seam: installs (stock b12x's _l2_flush_fn{extra})")
            stock = measure_stock_buffer(proof.original, device, l2)
            stock_bytes, measured = stock.nbytes, stock.measured
    how = "measured" if measured else "formula max(2 x L2, 64 MiB)"
    print(f"stock buffer per race job: {stock_bytes:,} bytes ({how})")
    window = settings.window_bytes(l2)
    print(f"window: {window:,} bytes ({settings.window})")
    if not args.checkpoint:
        print("storage read: not checked (pass this rank's checkpoint files to check it)")
        decision = None
        # Without a checkpoint, assume the window is covered: the verdict is about the machine.
        granted = credit(
            installable=blocked is None and settings.enabled,
            race_jobs=profile.race_jobs,
            stock_buffer_bytes=stock_bytes,
            window_bytes=window,
            read_bytes=window,
        )
        reason = (
            "disabled by config (enabled = false)" if not settings.enabled else blocked
        ) or granted.reason
    else:
        from ._headers import read_checkpoint
        from ._plan import decide_shard, shard_of

        decision = decide_shard(
            shard_of(read_checkpoint(args.checkpoint)),
            settings,
            l2_cache_bytes=l2,
            race_jobs=profile.race_jobs,
            stock_buffer_bytes=stock_bytes,
            blocked=blocked,
        )
        granted, reason = decision.credit, decision.credit.reason
        if decision.sources:
            shown = ", ".join(f"{s.name} ({s.storage_bytes:,} bytes)" for s in decision.sources)
            print(f"storage read: {shown}")
        else:
            print(f"storage read: none ({decision.choice.shortfall or reason})")
    if granted.nbytes == 0:
        print(f"verdict: falls back, credit 0 bytes: {reason}")
        return 1
    print(
        f"verdict: installs; credit {granted.nbytes:,} bytes "
        f"({profile.race_jobs} race jobs x {stock_bytes:,} bytes, "
        "less the eviction's own outputs and kernel code)"
    )
    return 0
