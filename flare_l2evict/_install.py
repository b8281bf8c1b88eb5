"""Install a :class:`WeightEviction` into b12x's start-up races, credit it, offer it, undo it.

An :class:`Installation`, handed its basis and its process (:class:`Holder`), owns all of
that from then on: the policies, the audit, the offer's hand-off with ``startup_complete``.
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Literal, Protocol

from ._b12x.patch import Locked, Patch
from ._b12x.proof import CreditBasis
from ._credit import WORD, Credit, credit
from ._errors import RuntimeContractError
from ._eviction import Kernel, WeightEviction
from ._report import DeviceAudit, ReclaimReport, RegionRead, StartupAudit, Words
from ._text import described, shown
from ._weights import WeightChoice

Mechanism = Literal["fork", "stock-seam"]


class Holder(Locked, Protocol):
    """The process that holds an installation: its lock, and forgetting a restored one."""

    def release(self, installation: Installation) -> None: ...


@dataclass(frozen=True)
class _Offer:
    nbytes: int
    allocator_error: str | None


class Installation:
    """Weights read in b12x's races on one device, the credit they back, and its offer.

    Invariants the KV allocator relies on:

    * :attr:`credit` is computed once, from the bytes really read: 0 unless the whole window is;
    * once :meth:`offer` records the credit, the installation stays until
      :meth:`end` (``startup_complete``), whatever the allocator does; an
      :meth:`end` during the offer restores once ``add_reclaimed`` returned;
    * :meth:`restore` is idempotent, safe from any thread and never raises an
      ``Exception`` (a failed undo is kept in :attr:`undo_error`); a restore while
      the offered credit stands is the audit's SHORTFALL;
    * :meth:`settle` is the start-up's one decision: kept iff the credit was offered.
    """

    def __init__(
        self,
        eviction: WeightEviction,
        undo: list[Callable[[], None]],
        patch: Patch,
        sources: tuple[RegionRead, ...],
        process: Holder,
        words: Words,
    ) -> None:
        self.words = words
        self.undo_error: str | None = None
        """What an undo step raised when restoring (``None``: stock came back)."""
        self._process = process
        self._cut_short = False
        self._done = False
        self.applying = True
        """b12x is being changed (:meth:`Process.install`): a restore meanwhile is not final."""
        self.device = eviction.device
        self.source_name = eviction.source_name
        self.read_bytes = eviction.read_bytes
        self.read_kernel = eviction.kernel
        self.basis: CreditBasis = patch.basis
        self.mechanism: Mechanism = "fork" if self.basis.fork is not None else "stock-seam"
        self.sources = sources
        self._eviction = eviction
        self._undo = undo
        self._patch = patch
        self._offer: _Offer | None = None
        self._offering = False
        self._ended = False
        self.restored = False
        self.credit: Credit = credit(
            installable=True,
            race_jobs=self.basis.race_jobs,
            stock_buffer_bytes=self.basis.stock.nbytes,
            window_bytes=self.basis.window_bytes // WORD * WORD,
            read_bytes=self.read_bytes,
        )

    def unheld(self) -> str | None:
        """Why a storage read is held by nothing but the eviction (``None``: the host holds all).

        Collects the young generations first (microseconds; a full collection can take
        a second), so a copy kept only by a young reference cycle is not taken for the host's.
        """
        gc.collect(1)
        return self._eviction.unheld()

    def kept(self, agreed_bytes: int, current: bool) -> bool:
        """Whether to offer: it credits, the ranks agreed, and its start-up is still current."""
        return not self.restored and agreed_bytes > 0 and current

    def settle(self) -> None:
        """The start-up's exit: kept if and only if :meth:`offer` recorded its credit.

        Idempotent, and the one place a start-up restores what it made.
        """
        self.offer_over()
        if self.offered_bytes == 0:
            self.restore()

    @property
    def eviction(self) -> WeightEviction:
        """What the races run before each sample (for benches and tests)."""
        return self._eviction

    @property
    def offered_bytes(self) -> int:
        """The credit offered to the KV allocator against this installation (0: none)."""
        return 0 if self._offer is None else self._offer.nbytes

    def offer(
        self,
        add: Callable[[ReclaimReport], object] | None,
        report: ReclaimReport,
        current: Callable[[], bool],
    ) -> bool:
        """Hand ``report`` to the allocator once, if ``current()``; whether it was handed.

        ``current`` and :attr:`restored` are asked under the process lock, so ``startup_complete``
        or ``restore()`` either came before (nothing offered) or waits for ``add_reclaimed`` to
        return (a ``restore()`` after it is audited). The credit is recorded before the call (it
        may apply from then on); what the allocator raised is recorded, then raised again.
        ``add`` ``None``: a program keeps the report; the credit is recorded all the same.
        """
        try:
            with self._process.lock:
                # A restore() that came first (a signal handler, another thread) put stock
                # b12x back: a credit recorded now would stand with nothing backing it.
                if self.restored or not current():
                    return False
                self._offer = _Offer(report.reclaimed_bytes, None)
                self._offering = True
            if add is not None:
                _check_returned(add(report))
        except BaseException as raised:
            if self._offer is not None:
                self._offer = replace(self._offer, allocator_error=described(raised, 500))
            raise
        finally:
            self.offer_over()
        return True

    @property
    def allocator_error(self) -> str | None:
        """What ``add_reclaimed`` raised, in one line (``None``: it returned)."""
        return None if self._offer is None else self._offer.allocator_error

    def offer_over(self) -> None:
        """The offer has returned (or never began): an :meth:`end` that came meanwhile restores.

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
        key, counts, peak = str(self.device), self._patch.counts, self._patch.peak
        credited = self.offered_bytes
        jobs = 0 if self._offer is None else self.basis.race_jobs
        made = counts[key].stock_bytes if key in counts else 0
        fell_back = self._eviction.fell_back_reason
        if self._cut_short and credited:  # races after restore() made unseen stock buffers
            made = credited
            fell_back = (
                f"flare_l2evict.restore() ran before {self.words.ends}, while the credit "
                "stood; the races after it allocated stock buffers"
            )
        counted = self.mechanism != "fork"
        unused = max(0, jobs - peak) * self.basis.stock.nbytes if counted else 0
        return StartupAudit(
            mechanism=self.mechanism,
            device=key,
            credited_bytes=credited,
            race_jobs=jobs,
            peak_alive=peak if counted else None,
            unused_credit_bytes=min(unused, credited),
            allocator_error=self.allocator_error,
            counted=counted,
            devices=tuple(DeviceAudit(device=d, **asdict(c)) for d, c in sorted(counts.items())),
            shortfall_bytes=min(made, credited),
            fallback_reason=fell_back,
        )

    def restore(self) -> None:
        """Stock b12x again, and no reference to the weights. Idempotent, from any thread."""
        with self._process.lock:
            if self._done:
                return
            if not self.restored:
                # Before the start-up's end: if a credit is (or is being) recorded, the races
                # after this allocate stock buffers the allocator was promised.
                self._cut_short = not self._ended
            self.restored = True
        # Resumable: a step is dropped only once it ran, so a restore cut short by an
        # asynchronous exception is finished by the next call (the start-up's exit calls twice).
        # Mid-patch every step is kept: the change a step undoes may land after it ran, and
        # the installer's last restore runs them all again (each undo is idempotent).
        for step in reversed(list(self._undo)) if self.applying else ():
            self._undo_step(step)
        while self._undo and not self.applying:
            step = self._undo[-1]
            self._undo_step(step)
            with self._process.lock:
                if self._undo and self._undo[-1] is step:
                    self._undo.pop()
        self._eviction.release()
        self._process.release(self)
        # Mid-patch, steps not yet registered are still to come: the installer restores
        # again once the patch is in place (Process.install).
        self._done = not self.applying

    def _undo_step(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as error:  # the fork's API refused None: say so, go on
            self.undo_error = self.undo_error or described(error, 500)

    def __repr__(self) -> str:
        state = "restored" if self.restored else f"reads {self.read_bytes:,} bytes"
        name = shown(repr(self.source_name), 120)
        return f"Installation({self.mechanism}, {name} on {self.device}, {state})"


def make_installation(
    choice: WeightChoice, basis: CreditBasis, process: Holder, words: Words, kernel: Kernel
) -> tuple[Installation, Callable[[], None]]:
    """Make b12x's race jobs on ``choice.device`` read the chosen weights, on a measured basis:
    returns the installation, which changes nothing yet, and the step that does."""
    patch = Patch(basis, process)
    eviction = WeightEviction(
        choice,  # the fallback must not hold the choice: it holds the weights
        fallback=patch.fallback(choice.device),
        kernel=kernel,
        until=words.ends,
    )
    sources = tuple(
        RegionRead(
            tensor=s.name, storage_bytes=s.nbytes, read_bytes=sum(p.nbytes for p in s.pieces)
        )
        for s in choice.regions
    )
    undo: list[Callable[[], None]] = []
    made = Installation(eviction, undo, patch, sources, process, words)
    return made, patch.step(eviction, undo)


def _check_returned(returned: object) -> None:
    """Raise if ``add_reclaimed`` returned an awaitable: its work has not run, may never run."""
    if not inspect.isawaitable(returned):
        return
    if inspect.iscoroutine(returned):
        returned.close()
    raise RuntimeContractError(
        f"kv_allocator.add_reclaimed returned {type(returned).__name__} (an awaitable): the "
        "credit may not have been applied; fix: make add_reclaimed a plain function that grows "
        "the KV budget before returning"
    )
