"""Install a :class:`WeightEviction` into b12x's start-up races, credit it, offer it, undo it.

An :class:`Installation` is made with the device's :class:`~._basis.CreditBasis`
and owns, from then on, everything about it: the credit (computed once, from
what it really reads), the offer to the KV allocator and its hand-off with
``startup_complete``, the audit, and the restore. The process holds at most
one (:data:`~._lifecycle.PROCESS`); :func:`active_installation` finds it.
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch

from ._basis import CreditBasis
from ._credit import Credit, credit
from ._errors import InstallError, RuntimeContractError
from ._eviction import EvictionHandle, Kernel, WeightEviction
from ._lifecycle import PROCESS
from ._report import DeviceAudit, ReclaimReport, RegionRead, StartupAudit
from ._seam import MARK, Flush, SeamFunction, SeamProof, StockBuffer, fork_function, held_bytes
from ._text import described, shown
from ._weights import WeightChoice, same_device
from ._window import WORD

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
        self.now = 0
        self.peak = 0

    # Handles die on whatever thread drops them: the process lock (fork-safe) orders them.
    def handed(self) -> None:
        with PROCESS.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def dropped(self) -> None:
        with PROCESS.lock:
            self.now -= 1


@dataclass(frozen=True)
class _Offer:
    nbytes: int
    race_jobs: int
    stock_buffer_bytes: int
    allocator_error: str | None


class Installation:
    """Weights read in b12x's races on one device, the credit they back, and its offer.

    Invariants the KV allocator relies on:

    * :attr:`credit` is computed once, when it is made, from the bytes its
      eviction really reads and the device's basis; it is 0 unless the
      eviction reads the whole window;
    * from the moment :meth:`offer` records the credit, the installation stays
      until :meth:`end` (``startup_complete``), whatever the allocator does or
      raises; :meth:`end` during the offer (another thread, or a signal
      handler on this one) restores once ``add_reclaimed`` has returned;
    * :meth:`restore` puts stock b12x back and drops every reference to the
      weights; it is idempotent and safe from any thread.
    """

    def __init__(
        self,
        mechanism: Mechanism,
        eviction: WeightEviction,
        undo: list[Callable[[], None]],
        counts: dict[str, _Counts],
        alive: _Alive,
        basis: CreditBasis,
        sources: tuple[RegionRead, ...],
    ) -> None:
        self.mechanism: Mechanism = mechanism
        self.device = eviction.device
        self.source_name = eviction.source_name
        self.read_bytes = eviction.read_bytes
        self.window_bytes = eviction.window_bytes
        self.read_kernel = eviction.kernel
        self.basis = basis
        self.sources = sources
        """What the eviction reads, per region, for the report."""
        self._eviction = eviction
        self._undo = undo
        self._counts = counts
        self._alive = alive
        self._offer: _Offer | None = None
        self._offering = False
        self._ended = False
        self.restored = False
        self.credit: Credit = credit(
            installable=True,
            race_jobs=basis.race_jobs,
            stock_buffer_bytes=basis.stock.nbytes,
            window_bytes=basis.window_bytes // WORD * WORD,
            read_bytes=self.read_bytes,
        )

    def views(self) -> tuple[torch.Tensor, ...]:
        """The 1-d float32 views the eviction reads (empty once restored)."""
        return self._eviction.views()

    def unheld(self) -> str | None:
        """Why a storage read is held by nothing but the eviction (``None``: the host holds all).

        Asked once the hook holds no host mapping. A copy made inside
        ``resident_tensors()`` and kept only by a reference cycle is young:
        collecting the young generations (microseconds; a full collection can
        take a second on a server's heap) frees it first, so it is not taken
        for the host's. One that survives longer is caught at a read once the
        collector frees it (the audit's FELL BACK and SHORTFALL).
        """
        gc.collect(1)
        return self._eviction.unheld()

    @property
    def eviction(self) -> Callable[[], None]:
        """The callable the races run before each sample (for benches and tests)."""
        return self._eviction

    @property
    def offered_bytes(self) -> int:
        """The credit offered to the KV allocator against this installation (0: none)."""
        return 0 if self._offer is None else self._offer.nbytes

    def offer(
        self,
        add: Callable[[ReclaimReport], object],
        report: ReclaimReport,
        current: Callable[[], bool],
    ) -> bool:
        """Hand ``report`` to the allocator once, if ``current()``; whether it was handed.

        ``current`` is asked under the process lock, so ``startup_complete``
        either came before (nothing offered; the caller restores) or comes
        after, and then waits for ``add_reclaimed`` to return. The credit is
        recorded before the call: from then on it may have been applied, so
        the installation stays and the audit holds it to it. What the
        allocator raised is recorded, then raised again.
        """
        try:
            with PROCESS.lock:
                if not current():
                    return False
                self._offer = _Offer(
                    report.reclaimed_bytes, self.basis.race_jobs, self.basis.stock.nbytes, None
                )
                self._offering = True
            _check_returned(add(report))
        except BaseException as raised:
            if self._offer is not None:
                self._offer = replace(self._offer, allocator_error=_one_line(raised))
            raise
        finally:
            self.offer_over()
        return True

    @property
    def allocator_error(self) -> str | None:
        """What ``add_reclaimed`` raised, in one line (``None``: it returned)."""
        return None if self._offer is None else self._offer.allocator_error

    def offer_over(self) -> None:
        """The offer has returned (or never began); an :meth:`end` that came meanwhile restores now.

        Idempotent: the start-up calls it again from its last guard, so an
        asynchronous exception inside the offer's own cleanup strands nothing.
        """
        self._offering = False
        if self._ended:
            self.restore()

    def end(self) -> None:
        """``startup_complete``: restore now, or once the offer in progress has returned."""
        self._ended = True
        if not self._offering:
            self.restore()

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
        """Stock b12x again, and no reference to the weights. Idempotent, from any thread."""
        with PROCESS.lock:
            if self.restored:
                return
            self.restored = True
        try:
            for undo in reversed(self._undo):
                undo()
        finally:
            self._eviction.release()
            PROCESS.release(self)

    def __repr__(self) -> str:
        state = "restored" if self.restored else f"reads {self.read_bytes:,} bytes"
        name = shown(repr(self.source_name), 120)
        return f"Installation({self.mechanism}, {name} on {self.device}, {state})"


def _one_line(error: BaseException) -> str:
    return described(error, 500)


def active_installation() -> Installation | None:
    """The installation in force in this process, if any."""
    return PROCESS.installed


def restore() -> None:
    """Put stock b12x back and release the weights, whatever is installed. Idempotent."""
    installation = PROCESS.installed
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
    original: SeamFunction, counts: dict[str, _Counts], stock: StockBuffer
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
            grown = stock.nbytes if made is None else held_bytes(made)
        entry = counts.setdefault(_device_key(device), _Counts())
        entry.stock_buffers += 1
        entry.stock_bytes += max(0, grown)
        return made

    return make


def install(
    choice: WeightChoice, basis: CreditBasis | None = None, *, kernel: Kernel = "auto"
) -> Installation:
    """Make b12x's race jobs on ``choice.device`` read the chosen weights.

    Where the fork's API is present (:func:`~._seam.fork_function`) it is
    handed the storage (and ``None`` to undo); otherwise stock b12x's seam as
    ``basis.proof`` found it: every seam module's function and every other
    binding of it is replaced by one function that hands each enabled call on
    ``choice.device`` an :class:`~flare_l2evict._eviction.EvictionHandle` of
    the one eviction, and defers to the original elsewhere. Every enabled
    call is counted for :meth:`Installation.audit`, with the handles alive at
    once, and every stock buffer made instead (other devices, or after the
    weights went away) with the bytes it allocated. While an installation is
    active, installing again raises :class:`~flare_l2evict.InstallError`.

    ``basis`` ``None`` (benches and tests outside a start-up) measures them
    here for 0 race jobs, so such an installation credits nothing.
    """
    found = basis if basis is not None else _basis_outside_startup(choice)
    return PROCESS.hold(lambda: _make(choice, found, kernel))


def _basis_outside_startup(choice: WeightChoice) -> CreditBasis:
    from ._basis import measure_basis
    from ._settings import L2EvictSettings

    l2 = None if choice.device.type == "cuda" else max(1, choice.window_bytes // 2)
    settings = L2EvictSettings.model_construct(window=choice.window_bytes)  # as chosen, unchecked
    return measure_basis(choice.device, l2, settings, 0)


def _make(choice: WeightChoice, basis: CreditBasis, kernel: Kernel) -> Installation:
    counts: dict[str, _Counts] = {}
    alive = _Alive()
    fork = fork_function() if basis.proof is None else None
    make_stock = None
    if basis.proof is not None:
        make_stock = _counted_stock(basis.proof.original, counts, basis.stock)
    device = choice.device  # the fallback must not hold the choice: it holds the weights
    eviction = WeightEviction(
        choice,
        fallback=None if make_stock is None else (lambda: make_stock(device, True)),
        kernel=kernel,
    )
    sources = tuple(
        RegionRead(
            tensor=s.name, storage_bytes=s.nbytes, read_bytes=sum(p.nbytes for p in s.pieces)
        )
        for s in choice.regions
    )
    if fork is not None:
        views = eviction.views()
        fork(views[0] if len(views) == 1 else views)
        return Installation("fork", eviction, [lambda: fork(None)], counts, alive, basis, sources)
    if basis.proof is None or make_stock is None:
        eviction.release()
        raise InstallError("the fork's API went away after it was found; stock b12x kept")
    undo = _redirect(basis.proof, eviction, counts, alive, make_stock)
    return Installation("stock-seam", eviction, undo, counts, alive, basis, sources)


def _check_returned(returned: object) -> None:
    """Raise if ``add_reclaimed`` returned an awaitable: its work has not run, may never run.

    A coroutine is closed (it never ran, so nothing was applied); either way
    the offer is recorded as raised, so the report and the audit say so.
    """
    if not inspect.isawaitable(returned):
        return
    if inspect.iscoroutine(returned):
        returned.close()
    raise RuntimeContractError(
        f"kv_allocator.add_reclaimed returned {type(returned).__name__} (an awaitable): the "
        "credit may not have been applied; fix: make add_reclaimed a plain function that grows "
        "the KV budget before returning"
    )


def _redirect(
    proof: SeamProof,
    eviction: WeightEviction,
    counts: dict[str, _Counts],
    alive: _Alive,
    make_stock: Callable[[object, bool], Flush | None],
) -> list[Callable[[], None]]:
    """Replace every seam the proof found; the undo steps, in the order they were done."""
    target = eviction.device
    home = counts.setdefault(_device_key(target), _Counts())
    replacements: dict[int, SeamFunction] = {}
    undo: list[Callable[[], None]] = []
    for module, original in proof.seams:
        replacement = _replacement(original, eviction, target, home, counts, alive, make_stock)
        replacements[id(original)] = replacement
        undo.append(_rebind(module, proof.row.function, original, replacement))
    for binding in proof.bindings:
        replacement = replacements[id(binding.original)]
        undo.append(_rebind(binding.owner, binding.name, binding.original, replacement))
    return undo


def _replacement(
    original: SeamFunction,
    eviction: WeightEviction,
    target: torch.device,
    home: _Counts,
    counts: dict[str, _Counts],
    alive: _Alive,
    stock: Callable[[object, bool], Flush | None],
) -> SeamFunction:
    def seam_replacement(device: object, *, enabled: bool) -> Flush | None:
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

    setattr(seam_replacement, MARK, True)
    seam_replacement.__wrapped__ = original  # type: ignore[attr-defined]
    return seam_replacement


def _rebind(owner: object, name: str, original: object, replacement: object) -> Callable[[], None]:
    setattr(owner, name, replacement)

    def undo() -> None:
        # Only put the original back if nobody replaced ours in the meantime.
        if getattr(owner, name, None) is replacement:
            setattr(owner, name, original)

    return undo
