"""``flare-l2evict check``: the preflight an operator runs before turning the plugin on.

It runs start-up's own steps without installing anything: the settings, the
basis (:func:`flare_l2evict._b12x.proof.measure_basis`: the seam proof, stock's
buffer measured on CUDA, the window), the decision on this rank's checkpoint
headers (as ``plan`` makes it) and the credit. Around them it names what only
an operator needs: the b12x provider and whether its release is judged, and
the device's persisting-L2 carve-out. One line per step, each within
:data:`WIDTH` columns with its detail on indented lines under it, each fact
once; or with ``as_json`` one object holding every figure.
"""

from __future__ import annotations

import importlib.metadata
import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._b12x.proof import CreditBasis, StockBuffer, device_l2_bytes, measure_basis
from .._b12x.provider import MIN_TORCH, NEEDED, versions
from .._b12x.table import FORK, rows
from .._credit import WORD, Credit, credit, stock_buffer_bytes
from .._decision import MAX_PIECES
from .._errors import InstallError
from .._settings import L2EvictSettings
from .._text import shown
from ._config_file import load_deployment_config
from ._inputs import DISABLED, settings_from_config
from ._origin import b12x_origin
from ._releases import judged
from ._steps import Steps, log_steps

if TYPE_CHECKING:
    import torch

    from ._headers import TensorHeader
    from ._profiles import DeviceProfile


log = logging.getLogger("flare_l2evict.tools.check")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_check(
    *,
    device: torch.device,
    device_reason: str,
    profile: DeviceProfile,
    config: Path | None = None,
    checkpoint: Sequence[Path] = (),
    as_json: bool = False,
    settings: L2EvictSettings | None = None,
    headers: list[TensorHeader] | None = None,
    races: bool = False,
) -> int:
    """Print the preflight; 0 if the plugin would install and credit (or is disabled by
    config), 1 if it would fall back (or, with ``races``, changed a winner).

    ``device_reason`` says why this device was checked (given, or the default
    on this machine); the first line says it. ``profile`` gives the race jobs,
    and L2 off CUDA. With ``as_json`` the report is one JSON object instead.
    ``settings`` and ``headers``, where the caller read them already, stand
    for ``config`` and ``checkpoint``. ``races`` (CUDA only) also runs
    :func:`~flare_l2evict.tools._races_check.race_check`.
    """
    # Every input is read before the first line, so bad input is one line on
    # stderr and nothing on stdout; then each step prints as it finishes, so a
    # step that hangs or crashes on a GPU still shows the ones before it.
    if settings is None:
        deployment: dict[str, Any] = load_deployment_config(config) if config else {}
        settings = settings_from_config(deployment)
    if headers is None and checkpoint:
        from ._headers import read_checkpoint

        headers = read_checkpoint(list(checkpoint))
    report = _Report(quiet=as_json)
    report.figures |= {"device": str(device), "device_reason": device_reason}
    own = _version("flare-l2evict") or "(not installed)"
    report.figures["flare_l2evict"] = own
    report.line(f"flare-l2evict {own} check on {device} ({device_reason})")
    steps = Steps()
    with steps.step("provider"):
        _provider_lines(report)
    with steps.step("basis"):
        basis, blocked = _basis(report, device, profile, settings)
    if not settings.enabled:
        blocked = DISABLED
    with steps.step("decision"):
        granted, condition = _storage_and_credit(
            report, headers, settings, basis, blocked, _memory_bytes(device, profile)
        )
    report.figures["condition"] = condition
    if not settings.enabled:
        # The operator's choice, not a fault: stock b12x, and nothing to act on.
        report.figures |= {"verdict": "disabled", "credit_bytes": 0, "reason": DISABLED}
        report.because("verdict: disabled by config, credit 0 bytes (stock b12x)", DISABLED)
        code = 0
    elif granted.nbytes == 0:
        reason = granted.reason or "nothing to credit"
        report.figures |= {"verdict": "falls back", "credit_bytes": 0, "reason": reason}
        report.because("verdict: falls back, credit 0 bytes", shown(reason, 600))
        code = 1
    elif condition is not None:
        # Never an unqualified "installs" for what was not checked: the storage is the rank's.
        report.figures |= {"verdict": "installs if", "credit_bytes": granted.nbytes, "reason": None}
        report.line(
            f"verdict: installs only if this rank's weights cover the window; credit "
            f"{granted.nbytes:,} bytes",
            f"not checked: {condition}; fix: pass this rank's checkpoint files to check it",
        )
        code = 0
    else:
        report.figures |= {"verdict": "installs", "credit_bytes": granted.nbytes, "reason": None}
        report.line(
            f"verdict: installs; credit {granted.nbytes:,} bytes",
            f"{basis.race_jobs} race jobs x {basis.stock.nbytes:,} bytes, "
            "less the eviction's own outputs and kernel code",
        )
        code = 0
    if races:
        from ._races_check import race_check

        with steps.step("races"):
            agreed = race_check(device, settings, report.line)
        report.figures["races"] = agreed.as_dict()
        if not agreed.agrees:
            code = 1
    log_steps(log, "check", steps.seconds)
    report.figures["exit_code"] = code
    if as_json:
        from ._json_models import dumped

        print(dumped("check", report.figures))
    return code


def _provider_lines(report: _Report) -> None:
    """Versions, and the b12x provider with whether its release has a judged row."""
    _, flashinfer = versions()
    origin = b12x_origin()
    fork = any(row.loaded() is not None for row in rows("fork"))
    provider = "fork" if fork else origin.provider
    row = (
        judged(origin.distribution, origin.version)
        if origin.distribution is not None and origin.version is not None
        else None
    )
    report.figures["versions"] = {"torch": _version("torch"), "flashinfer-python": flashinfer}
    report.figures["b12x"] = {
        "origin": origin.describe(),
        "provider": provider,
        "distribution": origin.distribution,
        "version": origin.version,
        "path": origin.path,
        "judged": None if row is None else ("installs" if row.installs else "falls back"),
    }
    # Each version once: flashinfer-python's here only where it is not the provider's release
    # (the provider line names that one).
    torch_line = f"torch {_version('torch') or 'not installed'}"
    if origin.distribution != "flashinfer-python":
        torch_line += f"; flashinfer-python {flashinfer or 'not installed'}"
        if flashinfer:
            torch_line += " (not the b12x provider)"
    report.line(torch_line)
    release = f"{origin.distribution} {origin.version}" if origin.distribution else "no release"
    if row is not None:
        table = f"judged table: {'installs' if row.installs else 'falls back'}"
    elif origin.path is None:
        table = "nothing to judge"
    else:
        table = "not in the judged table: the seam proof below judges it"
    via = f" with the fork's {FORK.function}" if fork else ""
    if origin.path is None:
        imported = "import b12x: not importable"
    elif origin.distribution is None:
        imported = f"import b12x loads {shown(origin.path)} (no installed distribution owns it)"
    else:
        imported = f"import b12x loads {shown(origin.path)}"
    report.line(f"b12x provider: {provider} ({shown(release)}){via}; {table}", imported)
    torch_floor = ".".join(map(str, MIN_TORCH))
    report.figures["supported"] = {"b12x": NEEDED, "torch": f">={torch_floor}"}
    report.line(f"supported: {NEEDED} (or a fork with {FORK.function}); torch>={torch_floor}")


def _basis(
    report: _Report,
    device: torch.device,
    profile: DeviceProfile,
    settings: L2EvictSettings,
) -> tuple[CreditBasis, str | None]:
    """Start-up's basis on ``device``, and the seam's refusal (the formula buffer then)."""
    l2_from_profile = device.type != "cuda"
    l2 = profile.l2_cache_bytes if l2_from_profile else device_l2_bytes(device)
    l2_source = f"profile {profile.name}" if l2_from_profile else "read from the device"
    report.figures |= {"l2_cache_bytes": l2, "l2_source": l2_source, "race_jobs": profile.race_jobs}
    report.line(f"device: {device} (L2 {l2:,} bytes, {l2_source})")
    _persisting_l2(report, device, l2)
    blocked: str | None = None
    try:
        basis = measure_basis(device, l2, settings, profile.race_jobs)
    except InstallError as error:
        blocked = str(error)
    except Exception as error:  # the runtime's own fault: start-up falls back on it too
        blocked = (
            f"the seam proof raised {type(error).__name__} ({shown(str(error), 200)}): the b12x "
            "modules loaded are not what the plugin knows (a module replaced or patched?); "
            "fix: run check in a fresh process, or reinstall the b12x provider"
        )
    if blocked is not None:
        formula = StockBuffer(stock_buffer_bytes(l2), measured=False)
        basis = CreditBasis(l2, settings.window_bytes(l2), formula, profile.race_jobs, None)
        report.figures["seam"] = {"verdict": "falls back", "via": None, "reason": blocked}
        report.because("seam: falls back", shown(blocked, 600))
    else:
        _seam_installs(report, basis)
    how = "measured" if basis.stock.measured else "formula max(2 x L2, 64 MiB)"
    report.figures["stock_buffer"] = {"bytes": basis.stock.nbytes, "measured": basis.stock.measured}
    report.line(f"stock buffer per race job: {basis.stock.nbytes:,} bytes ({how})")
    report.figures["window"] = {"bytes": basis.window_bytes, "setting": settings.window}
    setting = "stock" if settings.window == "stock" else "the config's window"
    report.line(f"window: {basis.window_bytes:,} bytes ({setting})")
    return basis, blocked


def _seam_installs(report: _Report, basis: CreditBasis) -> None:
    if basis.proof is None:
        fork = {"verdict": "installs", "via": f"fork {FORK.function}", "reason": None}
        report.figures["seam"] = fork
        report.line(f"seam: the fork's {FORK.dotted} (formula buffer)")
        return
    bindings = len(basis.proof.bindings)
    report.figures["seam"] = {
        "verdict": "installs",
        "via": f"stock {basis.proof.row.function}",
        "extra_bindings": bindings,
        "reason": None,
    }
    extra = f"; {bindings} extra bindings redirected" if bindings else ""
    report.line(f"seam: installs (stock b12x's {basis.proof.row.function}{extra})")


def _memory_bytes(device: torch.device, profile: DeviceProfile) -> int:
    """The device's memory: read from a CUDA device, else the profile's."""
    if device.type != "cuda":
        return profile.memory_bytes
    import torch

    return int(torch.cuda.get_device_properties(device).total_memory)


def window_condition(window_bytes: int) -> str:
    """What this rank's resident weights must hold for start-up to install: the one thing
    ``check`` cannot see without the rank's checkpoint, and what ``plan`` tests on it."""
    return (
        f"this rank's resident weights must cover the {window_bytes:,}-byte window: storages "
        f"owned by torch and not excluded, {window_bytes:,} bytes in all, in at most "
        f"{MAX_PIECES} storages"
    )


def _storage_and_credit(
    report: _Report,
    headers: list[TensorHeader] | None,
    settings: L2EvictSettings,
    basis: CreditBasis,
    blocked: str | None,
    memory_bytes: int,
) -> tuple[Credit, str | None]:
    """The decision on this rank's checkpoint; without one, the machine's credit and the
    condition on the weights it rests on (``None``: the checkpoint was checked)."""
    storage: dict[str, Any] = {"checked": headers is not None}
    report.figures["storage_read"] = storage
    if headers is None:
        report.line("storage read: not checked (pass this rank's checkpoint files to check it)")
        if blocked is not None:
            return Credit(0, blocked), None
        window = basis.window_bytes // WORD * WORD
        if window > memory_bytes:  # no weights on this device can cover it: as plan would say
            return Credit(
                0,
                f"the {window:,}-byte eviction window is larger than the device's "
                f"{memory_bytes:,} bytes of memory, so no resident weights can cover it; fix: "
                "set a smaller window in the config's [plugins.l2evict] (or 'stock')",
            ), None
        granted = credit(
            installable=True,
            race_jobs=basis.race_jobs,
            stock_buffer_bytes=basis.stock.nbytes,
            window_bytes=window,
            read_bytes=window,
        )
        return granted, window_condition(window) if granted.nbytes else None
    from ._plan import cut_name, decide_shard, shard_of

    decision = decide_shard(
        shard_of(headers),
        settings,
        l2_cache_bytes=basis.l2_cache_bytes,
        race_jobs=basis.race_jobs,
        stock_buffer_bytes=basis.stock.nbytes,
        blocked=blocked,
    )
    storage |= {
        "read_bytes": decision.read_bytes,
        # Cut as plan and startup cut them: a 15 MiB name costs 80 characters here too.
        "tensors": [{"name": cut_name(s.name), "bytes": s.storage_bytes} for s in decision.regions],
    }
    if decision.regions:
        count = len(decision.regions)
        report.line(
            f"storage read: {count:,} {'storage' if count == 1 else 'storages'}",
            *(f"{shown(s.name, 120)} ({s.storage_bytes:,} bytes)" for s in decision.regions),
        )
    else:
        why = decision.chosen.shortfall or decision.credit.reason or ""
        report.because("storage read: none", shown(why, 600))
    return decision.credit, None


def _persisting_l2(report: _Report, device: torch.device, l2_cache_bytes: int) -> None:
    """The set-aside's figure on its line, as information; where it was read under it.

    It never changes the verdict or the exit code: the set-aside holds only lines
    a kernel marks persisting, for stock's races and the plugin's alike.
    """
    from ._persisting_l2 import ACT, persisting_l2_line

    line, figures = persisting_l2_line(device, l2_cache_bytes)
    report.figures["persisting_l2"] = figures
    nbytes = figures.get("bytes")
    if not figures["applicable"]:
        report.line(line)
    elif "fault" in figures:
        report.line("persisting L2 carve-out: not read", line.partition("not read: ")[2])
    elif nbytes is None:
        report.line("persisting L2 carve-out: not read", shown(str(figures.get("via")), 600))
    else:
        read = f"(cudaLimitPersistingL2CacheSize, read via {figures['via']})"
        if nbytes == 0:
            report.line("persisting L2 carve-out: 0 bytes: every L2 line can be evicted", read)
        else:
            report.line(
                f"persisting L2 carve-out: {nbytes:,} bytes set aside (information, not a fault)",
                f"{read}: only lines a kernel marks persisting are held there, and they survive "
                f"stock's eviction and the plugin's read alike; {ACT}",
            )


WIDTH = 100
"""Columns of every line ``check`` prints; a step's detail goes on indented lines under it."""


class _Report:
    """The report's lines, printed as they come unless the report is JSON, and its figures."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.figures: dict[str, Any] = {}
        self.reasons: set[str] = set()

    def because(self, text: str, reason: str) -> None:
        """``text`` with ``reason`` under it, or, if a line above gave it, pointing there."""
        if reason in self.reasons:
            self.line(f"{text} (the reason above)")
        else:
            self.reasons.add(reason)
            self.line(text, reason)

    def line(self, text: str, *details: str) -> None:
        """``text`` on its own line; each of ``details`` wrapped, indented 4, under it."""
        if self.quiet:
            return
        lines = textwrap.wrap(text, WIDTH, subsequent_indent="    ", break_on_hyphens=False)
        for detail in details:
            lines += textwrap.wrap(
                detail,
                WIDTH,
                initial_indent="    ",
                subsequent_indent="      ",
                break_on_hyphens=False,
            )
        print("\n".join(lines), flush=True)
