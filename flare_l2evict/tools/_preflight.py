"""``check``'s steps: start-up's own steps on this machine, each with its lines and its figures.

Nothing is installed. Each step prints its lines as it finishes (so a step that hangs
or crashes on a GPU still shows the ones before it) and returns its part of what
``check --json`` prints, a model declared here: the b12x provider and whether its
release is judged (:func:`provider`), the basis start-up measures (:func:`basis`: the
seam proof, stock's buffer on CUDA, the window; with the device's persisting-L2
carve-out, information only), and the decision on this rank's checkpoint headers, as
``plan`` makes it, with its credit (:func:`storage_and_credit`). Torch is imported only
by the steps that ask the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field, NonNegativeInt

from .._b12x.provider import MIN_TORCH, NEEDED, installed_version, versions
from .._b12x.table import FORK, rows
from .._credit import WORD, Credit, credit, stock_buffer_bytes
from .._decision import MAX_PIECES
from .._errors import InstallError
from .._settings import L2EvictSettings
from .._text import shown
from ._json_output import Output
from ._origin import b12x_origin, judged
from ._persisting_l2 import PersistingL2
from ._plan import RACE_JOBS_FLAG, cut_name
from ._wrapping import wrap

if TYPE_CHECKING:
    import torch

    from .._b12x.proof import CreditBasis
    from ._headers import TensorHeader
    from ._profiles import DeviceProfile


class CheckVersions(Output):
    """Versions installed here."""

    torch: str | None = Field(description="torch's version, or null when not installed.")
    flashinfer_python: str | None = Field(
        alias="flashinfer-python", description="flashinfer-python's, or null when not installed."
    )


class CheckB12x(Output):
    """The b12x that ``import b12x`` loads here, and whether its release is judged."""

    origin: str = Field(description="The release that provides it, in words.")
    provider: str = Field(description="standalone, FlashInfer, fork, or none.")
    distribution: str | None = Field(description="The distribution that owns it, or null.")
    version: str | None = Field(description="That distribution's version, or null.")
    path: str | None = Field(description="The file import b12x loads, or null.")
    judged: Literal["installs", "falls back"] | None = Field(
        description="The judged release table's verdict; null when it has no row."
    )


class CheckSupported(Output):
    """What the plugin supports."""

    b12x: str = Field(description="The b12x releases.")
    torch: str = Field(description="The torch releases.")


class CheckSeam(Output):
    """b12x's seam, proved as start-up proves it."""

    verdict: Literal["installs", "falls back"] = Field(description="Whether it would install.")
    via: str | None = Field(description="The seam it would install through, or null.")
    extra_bindings: NonNegativeInt | None = Field(
        default=None,
        description="Extra bindings of stock's seam it would redirect; null for the fork.",
    )
    reason: str | None = Field(description="Why it falls back, or null.")


class CheckStockBuffer(Output):
    """Stock's eviction buffer per race job."""

    bytes: NonNegativeInt = Field(description="Its bytes.")
    measured: bool = Field(description="True on CUDA (measured); false: max(2 x L2, 64 MiB).")


class CheckWindow(Output):
    """The bytes read per eviction."""

    bytes: NonNegativeInt = Field(description="Its bytes.")
    setting: int | Literal["stock"] = Field(
        description="The config's window: 'stock', or the byte count it set."
    )


class CheckTensor(Output):
    """One storage that would be read."""

    name: str = Field(description="Its first tensor's name, cut as plan cuts names.")
    bytes: NonNegativeInt = Field(description="Its bytes.")


class CheckStorageRead(Output):
    """The storages this rank's checkpoint would be read from."""

    checked: bool = Field(description="False without a checkpoint (the other keys are null).")
    read_bytes: NonNegativeInt | None = Field(
        default=None, description="Bytes read per eviction, or null."
    )
    tensors: list[CheckTensor] | None = Field(
        default=None, description="The storages read, or null."
    )


class Lines:
    """The report's lines, printed as they come unless the report is JSON; each reason once."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.reasons: set[str] = set()

    def because(self, text: str, reason: str) -> None:
        """``text`` with ``reason`` under it, or, if a line above gave it, pointing there."""
        if reason in self.reasons:
            self.line(f"{text} (the reason above)")
        else:
            self.reasons.add(reason)
            self.line(text, reason)

    def line(self, text: str, *details: str, whole: Sequence[str] = ()) -> None:
        """``text`` on its own line; each of ``details`` wrapped, indented 4, under it
        (:func:`wrap`'s rule, ``whole`` kept whole)."""
        if self.quiet:
            return
        lines = wrap(text, rest="    ", whole=whole)
        for detail in details:
            lines += wrap(detail, first="    ", rest="      ", whole=whole)
        print("\n".join(lines), flush=True)


@dataclass(frozen=True)
class Provider:
    """:func:`provider`'s figures."""

    versions: CheckVersions
    b12x: CheckB12x
    supported: CheckSupported


def provider(lines: Lines) -> Provider:
    """Versions, and the b12x provider with whether its release has a judged row."""
    _, flashinfer = versions()
    origin = b12x_origin()
    fork = any(row.loaded() is not None for row in rows("fork"))
    name = "fork" if fork else origin.provider
    row = (
        judged(origin.distribution, origin.version)
        if origin.distribution is not None and origin.version is not None
        else None
    )
    found_torch = installed_version("torch")
    # Each version once: flashinfer-python's here only where it is not the provider's release
    # (the provider line names that one).
    torch_line = f"torch {found_torch or 'not installed'}"
    if origin.distribution != "flashinfer-python":
        torch_line += f"; flashinfer-python {flashinfer or 'not installed'}"
        if flashinfer:
            torch_line += " (not the b12x provider)"
    lines.line(torch_line)
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
    lines.line(f"b12x provider: {name} ({shown(release)}){via}; {table}", imported)
    torch_floor = ".".join(map(str, MIN_TORCH))
    lines.line(f"supported: {NEEDED} (or a fork with {FORK.function}); torch>={torch_floor}")
    return Provider(
        CheckVersions.model_validate({"torch": found_torch, "flashinfer-python": flashinfer}),
        CheckB12x(
            origin=origin.describe(),
            provider=name,
            distribution=origin.distribution,
            version=origin.version,
            path=origin.path,
            judged=None if row is None else ("installs" if row.installs else "falls back"),
        ),
        CheckSupported(b12x=NEEDED, torch=f">={torch_floor}"),
    )


@dataclass(frozen=True)
class Basis:
    """:func:`basis`'s figures: start-up's basis, and the seam's refusal (``blocked``)."""

    basis: CreditBasis
    blocked: str | None
    l2_source: str
    persisting_l2: PersistingL2
    seam: CheckSeam
    stock_buffer: CheckStockBuffer
    window: CheckWindow


def basis(
    lines: Lines, device: torch.device, profile: DeviceProfile, settings: L2EvictSettings
) -> Basis:
    """Start-up's basis on ``device``, and the seam's refusal (the formula buffer then)."""
    from .._b12x.proof import CreditBasis, StockBuffer, device_l2_bytes, measure_basis
    from ._persisting_l2 import persisting_l2_line

    l2_from_profile = device.type != "cuda"
    l2 = profile.l2_cache_bytes if l2_from_profile else device_l2_bytes(device)
    l2_source = f"profile {profile.name}" if l2_from_profile else "read from the device"
    lines.line(f"device: {device} (L2 {l2:,} bytes, {l2_source})")
    line, persisting = persisting_l2_line(device, l2)
    _persisting_l2(lines, line, persisting)
    blocked: str | None = None
    try:
        found = measure_basis(device, l2, settings, profile.race_jobs)
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
        found = CreditBasis(l2, settings.window_bytes(l2), formula, profile.race_jobs, None)
        seam = CheckSeam(verdict="falls back", via=None, reason=blocked)
        lines.because("seam: falls back", shown(blocked, 600))
    else:
        seam = _seam_installs(lines, found)
    how = "measured" if found.stock.measured else "formula max(2 x L2, 64 MiB)"
    lines.line(f"stock buffer per race job: {found.stock.nbytes:,} bytes ({how})")
    setting = "stock" if settings.window == "stock" else "the config's window"
    lines.line(f"window: {found.window_bytes:,} bytes ({setting})")
    return Basis(
        found,
        blocked,
        l2_source,
        persisting,
        seam,
        CheckStockBuffer(bytes=found.stock.nbytes, measured=found.stock.measured),
        CheckWindow(bytes=found.window_bytes, setting=settings.window),
    )


def _seam_installs(lines: Lines, found: CreditBasis) -> CheckSeam:
    if found.proof is None:
        lines.line(f"seam: the fork's {FORK.dotted} (formula buffer)")
        return CheckSeam(verdict="installs", via=f"fork {FORK.function}", reason=None)
    bindings = len(found.proof.bindings)
    extra = f"; {bindings} extra bindings redirected" if bindings else ""
    lines.line(f"seam: installs (stock b12x's {found.proof.row.function}{extra})")
    return CheckSeam(
        verdict="installs",
        via=f"stock {found.proof.row.function}",
        extra_bindings=bindings,
        reason=None,
    )


def _persisting_l2(lines: Lines, line: str, figures: PersistingL2) -> None:
    """The set-aside's figure on its line, as information; where it was read under it.

    It never changes the verdict or the exit code: the set-aside holds only lines
    a kernel marks persisting, for stock's races and the plugin's alike.
    """
    from ._persisting_l2 import ACT

    if not figures.applicable:
        lines.line(line)
    elif figures.fault is not None:
        lines.line("persisting L2 carve-out: not read", line.partition("not read: ")[2])
    elif figures.bytes is None:
        lines.line("persisting L2 carve-out: not read", shown(str(figures.via), 600))
    else:
        read = f"(cudaLimitPersistingL2CacheSize, read via {figures.via})"
        if figures.bytes == 0:
            lines.line("persisting L2 carve-out: 0 bytes: every L2 line can be evicted", read)
        else:
            lines.line(
                f"persisting L2 carve-out: {figures.bytes:,} bytes set aside (information, not "
                "a fault)",
                f"{read}: only lines a kernel marks persisting are held there, and they survive "
                f"stock's eviction and the plugin's read alike; {ACT}",
            )


def memory_bytes(device: torch.device, profile: DeviceProfile) -> int:
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


@dataclass(frozen=True)
class Decided:
    """:func:`storage_and_credit`'s figures: the credit, the condition it rests on (``None``:
    the checkpoint was checked), and the storage read."""

    credit: Credit
    condition: str | None
    storage_read: CheckStorageRead


def storage_and_credit(
    lines: Lines,
    headers: list[TensorHeader] | None,
    settings: L2EvictSettings,
    found: Basis,
    blocked: str | None,
    memory: int,
) -> Decided:
    """The decision on this rank's checkpoint; without one, the machine's credit and the
    condition on the weights it rests on."""
    if headers is None:
        lines.line("storage read: not checked (pass this rank's checkpoint files to check it)")
        unchecked = CheckStorageRead(checked=False)
        if blocked is not None:
            return Decided(Credit(0, blocked), None, unchecked)
        window = found.basis.window_bytes // WORD * WORD
        if window > memory:  # no weights on this device can cover it: as plan would say
            too_large = Credit(
                0,
                f"the {window:,}-byte eviction window is larger than the device's {memory:,} "
                "bytes of memory, so no resident weights can cover it; fix: set a smaller "
                "window in the config's [plugins.l2evict] (or 'stock')",
            )
            return Decided(too_large, None, unchecked)
        granted = credit(
            installable=True,
            race_jobs=found.basis.race_jobs,
            stock_buffer_bytes=found.basis.stock.nbytes,
            window_bytes=window,
            read_bytes=window,
            race_jobs_from=RACE_JOBS_FLAG,
        )
        condition = window_condition(window) if granted.nbytes else None
        return Decided(granted, condition, unchecked)
    from ._plan import decide_shard, shard_of

    decision = decide_shard(
        shard_of(headers),
        settings,
        l2_cache_bytes=found.basis.l2_cache_bytes,
        race_jobs=found.basis.race_jobs,
        stock_buffer_bytes=found.basis.stock.nbytes,
        blocked=blocked,
    )
    if decision.regions:
        count = len(decision.regions)
        lines.line(
            f"storage read: {count:,} {'storage' if count == 1 else 'storages'}",
            *(f"{shown(s.name, 120)} ({s.storage_bytes:,} bytes)" for s in decision.regions),
        )
    else:
        why = decision.chosen.shortfall or decision.credit.reason or ""
        lines.because("storage read: none", shown(why, 600))
    read = CheckStorageRead(
        checked=True,
        read_bytes=decision.read_bytes,
        # Cut as plan and startup cut them: a 15 MiB name costs 80 characters here too.
        tensors=[
            CheckTensor(name=cut_name(r.name), bytes=r.storage_bytes) for r in decision.regions
        ],
    )
    return Decided(decision.credit, None, read)
