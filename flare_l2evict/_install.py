"""Install a :class:`WeightEviction` into b12x's start-up races, and take it out again.

This module is the one owner of what the package changes in b12x: at most one
:class:`Installation` per process, held by a private slot object. It is found
with :func:`active_installation` and undone with :meth:`Installation.restore`
(or :func:`restore`); nothing outside this module changes the slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ._errors import InstallError
from ._eviction import EvictionHandle, Kernel, WeightEviction
from ._report import DeviceAudit, SourceRead, StartupAudit
from ._seam import (
    MARK,
    SEAM_FUNCTION,
    Flush,
    SeamFunction,
    SeamProof,
    StockBuffer,
    fork_function,
    held_bytes,
    measure_stock_buffer,
    prove_seam,
)
from ._source import SourceChoice, same_device
from ._text import shown

Mechanism = Literal["fork", "stock-seam"]


@dataclass
class _Counts:
    requested: int = 0
    served: int = 0
    stock_buffers: int = 0
    stock_bytes: int = 0


class _Alive:
    """Evictions the seam handed out that b12x has not dropped yet, and the most at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # handles die on whatever thread drops them
        self.now = 0
        self.peak = 0

    def handed(self) -> None:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def dropped(self) -> None:
        with self._lock:
            self.now -= 1


@dataclass(frozen=True)
class _Offer:
    nbytes: int
    race_jobs: int
    stock_buffer_bytes: int
    allocator_error: str | None


class Installation:
    """Weights read in b12x's races on one device; :meth:`restore` puts stock back.

    Public surface: :attr:`mechanism`, :attr:`device`, :attr:`source_name`,
    :attr:`sources`, :attr:`read_bytes`, :attr:`window_bytes`, :attr:`read_kernel`,
    :meth:`views` (what is read), :meth:`record_offer` (the credit offered
    against it), :meth:`audit` and :meth:`restore`.
    """

    def __init__(
        self,
        mechanism: Mechanism,
        eviction: WeightEviction,
        undo: list[Callable[[], None]],
        counts: dict[str, _Counts],
        alive: _Alive,
        sources: tuple[SourceRead, ...],
    ) -> None:
        self.mechanism: Mechanism = mechanism
        self.device = eviction.device
        self.source_name = eviction.source_name
        self.sources = sources
        self.read_bytes = eviction.read_bytes
        self.window_bytes = eviction.window_bytes
        self.read_kernel = eviction.kernel
        self._eviction = eviction
        self._undo = undo
        self._counts = counts
        self._alive = alive
        self._offer: _Offer | None = None
        self.restored = False

    def views(self) -> tuple[torch.Tensor, ...]:
        """The 1-d float32 views the eviction reads (empty once restored)."""
        return self._eviction.views()

    @property
    def eviction(self) -> Callable[[], None]:
        """The callable the races run before each sample (for benches and tests)."""
        return self._eviction

    @property
    def offered_bytes(self) -> int:
        """The credit offered to the KV allocator against this installation (0: none)."""
        return 0 if self._offer is None else self._offer.nbytes

    def record_offer(
        self,
        nbytes: int,
        *,
        race_jobs: int,
        stock_buffer_bytes: int,
        allocator_error: str | None = None,
    ) -> None:
        """Record the credit handed to the KV allocator, and what it raised if it did.

        Called before ``add_reclaimed`` and again if it raises: from the offer
        on, the credit may have been applied, so the audit holds it to it.
        """
        self._offer = _Offer(nbytes, race_jobs, stock_buffer_bytes, allocator_error)

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
        offer = self._offer or _Offer(0, 0, 0, None)
        made = self._counts[key].stock_bytes if key in self._counts else 0
        counted = self.mechanism != "fork"
        unused = 0
        if counted and offer.nbytes and self._alive.peak < offer.race_jobs:
            unused = (offer.race_jobs - self._alive.peak) * offer.stock_buffer_bytes
        return StartupAudit(
            mechanism=self.mechanism,
            device=key,
            credited_bytes=offer.nbytes,
            race_jobs=offer.race_jobs,
            peak_alive=self._alive.peak if counted else None,
            unused_credit_bytes=min(unused, offer.nbytes),
            allocator_error=offer.allocator_error,
            counted=counted,
            devices=devices,
            shortfall_bytes=min(made, offer.nbytes),
            fallback_reason=self._eviction.fell_back_reason,
        )

    def restore(self) -> None:
        """Stock b12x again, and no reference to the weights. Idempotent."""
        if self.restored:
            return
        self.restored = True
        try:
            for undo in reversed(self._undo):
                undo()
        finally:
            self._eviction.release()
            _SLOT.release(self)

    def __repr__(self) -> str:
        state = "restored" if self.restored else f"reads {self.read_bytes:,} bytes"
        name = shown(repr(self.source_name), 120)
        return f"Installation({self.mechanism}, {name} on {self.device}, {state})"


class _Slot:
    """The one installation a process may hold; only this module's code changes it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._active: Installation | None = None

    @property
    def active(self) -> Installation | None:
        return self._active

    def fill(self, make: Callable[[], Installation]) -> Installation:
        """Install what ``make`` builds, or refuse: the caller owns exactly what it gets."""
        with self._lock:
            if self._active is not None:
                raise InstallError(
                    f"{shown(repr(self._active), 300)} is already active in this process; "
                    "fix: restore() it (or call startup_complete) before installing again"
                )
            self._active = make()
            return self._active

    def release(self, installation: Installation) -> None:
        with self._lock:
            if self._active is installation:
                self._active = None


_SLOT = _Slot()


def active_installation() -> Installation | None:
    """The installation in force in this process, if any."""
    return _SLOT.active


def restore() -> None:
    """Put stock b12x back and release the weights, whatever is installed. Idempotent."""
    installation = _SLOT.active
    if installation is not None:
        installation.restore()


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
    stock: StockBuffer | None = None,
    *,
    kernel: Kernel = "auto",
) -> Installation:
    """Make b12x's race jobs on ``choice.device`` read the chosen weights.

    Tried in order: the fork's ``b12x.comm.pcie.use_startup_eviction``
    (restored with ``use_startup_eviction(None)``), then stock b12x's seam as
    ``proof`` found it: every seam module's ``_l2_flush_fn`` and every other
    binding of it is replaced by one function that hands each enabled call on
    ``choice.device`` an :class:`~flare_l2evict.EvictionHandle` of the one
    eviction, and defers to the original elsewhere. Every enabled call is
    counted for :meth:`Installation.audit`, with the handles alive at once, and
    every stock buffer made instead (other devices, or after the weights went
    away) with the bytes it allocated. While an installation is active,
    installing again raises :class:`~flare_l2evict.InstallError`, so a caller
    owns exactly the installation it gets. Without ``proof`` the seam is proven
    here (:class:`~flare_l2evict.InstallError` if it fails); without ``stock``
    stock's buffer is measured on the device (start-up passes the one it
    measured, so it is measured once).
    """
    return _SLOT.fill(lambda: _make(choice, proof, stock, kernel))


def _make(
    choice: SourceChoice, proof: SeamProof | None, stock: StockBuffer | None, kernel: Kernel
) -> Installation:
    counts: dict[str, _Counts] = {}
    alive = _Alive()
    fork = fork_function()
    if fork is None and proof is None:
        proof = prove_seam()
    if stock is None and proof is not None:
        stock = measure_stock_buffer(proof.original, choice.device, choice.window_bytes // 2)
    make_stock = (
        None
        if proof is None or stock is None
        else _counted_stock(proof.original, counts, stock.nbytes)
    )
    device = choice.device  # the fallback must not hold the choice: it holds the weights
    eviction = WeightEviction(
        choice,
        fallback=None if make_stock is None else (lambda: make_stock(device, True)),
        kernel=kernel,
    )
    sources = tuple(
        SourceRead(
            tensor=s.name, storage_bytes=s.nbytes, read_bytes=sum(p.nbytes for p in s.pieces)
        )
        for s in choice.storages
    )
    undo: list[Callable[[], None]] = []
    if fork is not None:
        views = eviction.views()
        fork(views[0] if len(views) == 1 else views)
        undo.append(lambda: fork(None))
        return Installation("fork", eviction, undo, counts, alive, sources)
    assert proof is not None and make_stock is not None
    target = eviction.device
    home = counts.setdefault(_device_key(target), _Counts())
    replacements: dict[int, SeamFunction] = {}
    for module, original in proof.seams:
        replacement = _replacement(original, eviction, target, home, counts, alive, make_stock)
        replacements[id(original)] = replacement
        undo.append(_rebind(module, SEAM_FUNCTION, original, replacement))
    for binding in proof.bindings:
        undo.append(
            _rebind(
                binding.owner, binding.name, binding.original, replacements[id(binding.original)]
            )
        )
    return Installation("stock-seam", eviction, undo, counts, alive, sources)


def _replacement(
    original: SeamFunction,
    eviction: WeightEviction,
    target: torch.device,
    home: _Counts,
    counts: dict[str, _Counts],
    alive: _Alive,
    stock: Callable[[object, bool], Flush | None],
) -> SeamFunction:
    def _l2_flush_fn(device: object, *, enabled: bool) -> Flush | None:
        if not enabled:
            return original(device, enabled=enabled)
        here = same_device(torch.device(device), target)  # type: ignore[call-overload]
        if here and not eviction.released:
            home.requested += 1
            home.served += 1
            alive.handed()
            return EvictionHandle(eviction, alive.dropped)
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
