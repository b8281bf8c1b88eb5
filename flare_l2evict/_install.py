"""Install a :class:`WeightEviction` into b12x's start-up races, and take it out again.

This module is the one owner of what the package changes in b12x: at most one
:class:`Installation` per process, found with :func:`active_installation` and
undone with :meth:`Installation.restore` (or :func:`restore`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ._eviction import WeightEviction
from ._report import DeviceAudit, SourceRead, StartupAudit
from ._seam import (
    MARK,
    SEAM_FUNCTION,
    Flush,
    SeamFunction,
    SeamProof,
    fork_function,
    held_bytes,
    measure_stock_buffer,
    prove_seam,
)
from ._source import SourceChoice, _same_device

Mechanism = Literal["fork", "stock-seam"]


@dataclass
class _Counts:
    requested: int = 0
    served: int = 0
    stock_buffers: int = 0
    stock_bytes: int = 0


class Installation:
    """Weights read in b12x's races on one device; :meth:`restore` puts stock back.

    Public surface: :attr:`mechanism`, :attr:`device`, :attr:`source_name`,
    :attr:`sources`, :attr:`read_bytes`, :attr:`window_bytes`, :attr:`read_kernel`,
    :meth:`views` (what is read), :attr:`credited_bytes` (set by the start-up once
    the credit is known), :meth:`audit` and :meth:`restore`.
    """

    def __init__(
        self,
        mechanism: Mechanism,
        eviction: WeightEviction,
        undo: list[Callable[[], None]],
        counts: dict[str, _Counts],
        sources: tuple[SourceRead, ...],
    ) -> None:
        self.mechanism: Mechanism = mechanism
        self.device = eviction.device
        self.source_name = eviction.source_name
        self.sources = sources
        self.read_bytes = eviction.read_bytes
        self.window_bytes = eviction.window_bytes
        self.read_kernel = eviction.kernel
        self.credited_bytes = 0
        self._eviction = eviction
        self._undo = undo
        self._counts = counts
        self.restored = False

    def views(self) -> tuple[torch.Tensor, ...]:
        """The 1-d float32 views the eviction reads (empty once restored)."""
        return self._eviction.views()

    @property
    def eviction(self) -> Callable[[], None]:
        """The callable the races run before each sample (for benches and tests)."""
        return self._eviction

    def audit(self) -> StartupAudit:
        """What b12x asked of the seam so far, per device, and the credit it cost."""
        key = str(self.device)
        devices = tuple(
            DeviceAudit(
                device=device,
                requested=c.requested,
                served_by_weights=c.served,
                stock_buffers=c.stock_buffers,
                stock_bytes=c.stock_bytes,
            )
            for device, c in sorted(self._counts.items())
        )
        made = self._counts[key].stock_bytes if key in self._counts else 0
        return StartupAudit(
            mechanism=self.mechanism,
            device=key,
            credited_bytes=self.credited_bytes,
            counted=self.mechanism != "fork",
            devices=devices,
            shortfall_bytes=min(made, self.credited_bytes),
        )

    def restore(self) -> None:
        """Stock b12x again, and no reference to the weights. Idempotent."""
        global _ACTIVE
        if self.restored:
            return
        self.restored = True
        try:
            for undo in reversed(self._undo):
                undo()
        finally:
            self._eviction.release()
            if _ACTIVE is self:
                _ACTIVE = None

    def __repr__(self) -> str:
        state = "restored" if self.restored else f"reads {self.read_bytes:,} bytes"
        return f"Installation({self.mechanism}, {self.source_name!r} on {self.device}, {state})"


_ACTIVE: Installation | None = None


def active_installation() -> Installation | None:
    """The installation in force in this process, if any."""
    return _ACTIVE


def restore() -> None:
    """Put stock b12x back and release the weights, whatever is installed. Idempotent."""
    if _ACTIVE is not None:
        _ACTIVE.restore()


def _device_key(device: object) -> str:
    try:
        found = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError, ValueError):
        return repr(device)
    if found.type == "cuda" and found.index is None and torch.cuda.is_available():
        found = torch.device("cuda", torch.cuda.current_device())
    return str(found)


def _counted_stock(
    original: SeamFunction, counts: dict[str, _Counts], modelled_bytes: int
) -> Callable[[object, bool], Flush | None]:
    """Stock's eviction for ``device``, counted as a stock buffer with the bytes it took.

    ``make(device, fallback)``: off CUDA, an original that cannot make a buffer
    (stock b12x reads the L2 size from a CUDA device) raises as stock would,
    unless ``fallback`` (the weights went away mid-start-up): then no eviction
    is made and what a GPU would have allocated is counted.
    """

    def make(device: object, fallback: bool) -> Flush | None:
        target = torch.device(device)  # type: ignore[call-overload]
        if target.type == "cuda":
            before = torch.cuda.memory_allocated(target)
            made = original(target, enabled=True)
            grown = torch.cuda.memory_allocated(target) - before
        else:
            try:
                made = original(target, enabled=True)
            except Exception:
                if not fallback:
                    raise
                made = None
            grown = modelled_bytes if made is None else held_bytes(made)
        entry = counts.setdefault(_device_key(device), _Counts())
        entry.stock_buffers += 1
        entry.stock_bytes += max(0, grown)
        return made

    return make


def install(
    choice: SourceChoice,
    proof: SeamProof | None = None,
    stock_buffer_bytes: int | None = None,
) -> Installation:
    """Make b12x's race jobs on ``choice.device`` read the chosen weights.

    Tried in order: the fork's ``b12x.comm.pcie.use_startup_eviction``
    (restored with ``use_startup_eviction(None)``), then stock b12x's seam as
    ``proof`` found it: every seam module's ``_l2_flush_fn`` and every other
    binding of it is replaced by one function that returns the eviction for
    enabled calls on ``choice.device`` and defers to the original elsewhere.
    Every enabled call is counted for :meth:`Installation.audit`, and every
    stock buffer made instead (other devices, or after the weights went away)
    with the bytes it allocated. While an installation is active, installing
    again returns it unchanged. Without ``proof`` the seam is proven here
    (:class:`~flare_l2evict.InstallError` if it fails); without
    ``stock_buffer_bytes`` stock's buffer is measured on the device.
    """
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    counts: dict[str, _Counts] = {}
    fork = fork_function()
    if fork is None and proof is None:
        proof = prove_seam()
    if stock_buffer_bytes is None:
        stock_buffer_bytes = (
            measure_stock_buffer(proof.original, choice.device, choice.window_bytes // 2).nbytes
            if proof is not None
            else 0
        )
    stock = None if proof is None else _counted_stock(proof.original, counts, stock_buffer_bytes)
    eviction = WeightEviction(
        choice, fallback=None if stock is None else (lambda: stock(choice.device, True))
    )
    sources = tuple(SourceRead(tensor=s.name, storage_bytes=s.nbytes) for s in choice.storages)
    undo: list[Callable[[], None]] = []
    if fork is not None:
        views = eviction.views()
        fork(views[0] if len(views) == 1 else views)
        undo.append(lambda: fork(None))
        _ACTIVE = Installation("fork", eviction, undo, counts, sources)
        return _ACTIVE
    assert proof is not None and stock is not None
    target = eviction.device
    home = counts.setdefault(_device_key(target), _Counts())
    replacements: dict[int, SeamFunction] = {}
    for module, original in proof.seams:
        replacement = _replacement(original, eviction, target, home, counts, stock)
        replacements[id(original)] = replacement
        undo.append(_rebind(module, SEAM_FUNCTION, original, replacement))
    for binding in proof.bindings:
        undo.append(
            _rebind(
                binding.owner, binding.name, binding.original, replacements[id(binding.original)]
            )
        )
    _ACTIVE = Installation("stock-seam", eviction, undo, counts, sources)
    return _ACTIVE


def _replacement(
    original: SeamFunction,
    eviction: WeightEviction,
    target: torch.device,
    home: _Counts,
    counts: dict[str, _Counts],
    stock: Callable[[object, bool], Flush | None],
) -> SeamFunction:
    def _l2_flush_fn(device: object, *, enabled: bool) -> Flush | None:
        if not enabled:
            return original(device, enabled=enabled)
        here = _same_device(torch.device(device), target)  # type: ignore[call-overload]
        if here and not eviction.released:
            home.requested += 1
            home.served += 1
            return eviction
        counts.setdefault(_device_key(device), _Counts()).requested += 1
        return stock(device, False)

    setattr(_l2_flush_fn, MARK, True)
    _l2_flush_fn.__wrapped__ = original  # type: ignore[attr-defined]
    return _l2_flush_fn


def _rebind(owner: object, name: str, original: object, replacement: object) -> Callable[[], None]:
    setattr(owner, name, replacement)

    def undo() -> None:
        # Only put the original back if nobody replaced ours in the meantime.
        if getattr(owner, name, None) is replacement:
            setattr(owner, name, original)

    return undo
