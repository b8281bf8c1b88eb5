r"""One start-up of the plugin in this process: its phase, its lock, its undo, its offer.

:class:`Startup` holds every piece of state the plugin keeps between calls, as
pluggy's ``PluginManager`` does for a manager: the process's one start-up slot
and lock, and per start-up its :class:`Phase`, the seam's undo steps, the offer
and the agreement round. Each transition is one method, taken under the lock;
the lock is never held while host code runs (the KV allocator is called between
:meth:`Startup.offer` and :meth:`Startup.offered`; host tensors are released
outside it). The parts below (basis, choice, eviction, seam, credit, agreement,
report) are passive: none imports this module or calls back into it.

Phases, and the method that makes each transition::

    begin()  ->  BEGUN --install()--> INSTALLED --offer()--> OFFERING --offered()--> CREDITED
                   |                     |  \                   |                        |
                   |   settle()/restore()|   keep() -> KEPT     end()                    restore()
                   v                     v                      v                        v
                 ENDED <----end()---- FELL_BACK             ENDING --offered()-->  CUT_SHORT
                   ^                                            |
                   +---------------------- end() ---------------+ (and from every other phase)

    KEPT: a host that sizes its KV cache by measurement; nothing is offered or credited.

Invariants the KV allocator relies on:

* at most one start-up per process; it ends only by ``startup_complete`` with its
  owner (the runtime, or the block) or with a report it handed out, never, while
  its credit stands, by another runtime or by ``None``;
* nothing stays installed that is not credited: the caller's exit (:meth:`settle`)
  restores unless the offer began; a credit stays backed until its start-up ends
  (from OFFERING on only :meth:`end`, or an operator's :func:`restore`, audited as
  SHORTFALL, undoes the install);
* :meth:`restore` is the one place that puts stock b12x back. It reads the phase, so
  calling it again is harmless, and it resumes by itself what an exception cut short.
"""

from __future__ import annotations

import enum
import functools
import gc
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import ClassVar, ParamSpec, TypeVar

from ._b12x.seam import Seam
from ._errors import InstallError
from ._eviction import WeightEviction
from ._log import say
from ._report import DeviceAudit, ReclaimReport, StartupAudit, Wording
from ._text import described, shown

log = logging.getLogger("flare_l2evict")
_P = ParamSpec("_P")
_R = TypeVar("_R")


class Phase(enum.Enum):
    """Where a start-up is; the module docstring draws the transitions."""

    BEGUN = "begun"  # the slot is taken; b12x is as it was
    INSTALLING = "installing"  # the seam is being changed (each undo registered first)
    INSTALLED = "installed"  # races read the weights; nothing offered yet
    OFFERING = "offering"  # the credit is recorded; add_reclaimed runs (it may apply it)
    CREDITED = "credited"  # the offer is over: kept until the start-up ends
    KEPT = "kept"  # installed for a host that sizes its KV cache by measurement: no credit
    ENDING = "ending"  # startup_complete came during the offer: restored once it returns
    CUT_SHORT = "cut short"  # restore() while the credit stood: later races make stock buffers
    FELL_BACK = "fell back"  # stock b12x is back; nothing credited
    ENDED = "ended"  # over: stock b12x, no reference to the weights, the slot free


_AFTER_RESTORE = {
    Phase.BEGUN: Phase.FELL_BACK,
    Phase.INSTALLED: Phase.FELL_BACK,
    Phase.OFFERING: Phase.CUT_SHORT,
    Phase.CREDITED: Phase.CUT_SHORT,
    Phase.KEPT: Phase.CUT_SHORT,
}
_STANDS = frozenset({Phase.OFFERING, Phase.CREDITED, Phase.KEPT, Phase.ENDING, Phase.CUT_SHORT})
"""Phases in which the host relies on the install: its allocator may hold the credit, or (KEPT)
its measured KV cache counts on the races reading weights."""


@dataclass(frozen=True)
class Busy:
    """Why :meth:`Startup.begin` refused: how the call relates to the active start-up."""

    how: str
    active: str


def _resumed(transition: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``transition``; if an exception (a signal handler's) cuts it short, run it once more
    before letting the exception go. Each transition reads the phase and the steps left, so
    the second run finishes what the first did not, and repeats nothing it did."""

    @functools.wraps(transition)
    def resumed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return transition(*args, **kwargs)
        except BaseException:
            transition(*args, **kwargs)
            raise

    return resumed


def _held(owner: object) -> Callable[[], object]:
    try:
        return weakref.ref(owner)
    except TypeError:  # no __weakref__ slot: held strongly until the start-up ends
        return lambda: owner


class Startup:
    """One start-up, from :meth:`begin` to :meth:`end` (see the module docstring)."""

    _lock: ClassVar[threading.RLock] = threading.RLock()
    _active: ClassVar[Startup | None] = None
    _rounds: ClassVar[Iterator[int]] = itertools.count()

    def __init__(self, owner: object, token: object, wording: Wording) -> None:
        self.phase = Phase.BEGUN
        self.wording = wording
        self.thread = threading.get_ident()
        self.offered_bytes = 0
        self.allocator_error: str | None = None
        self.undo_error: str | None = None
        """What an undo step raised the last time it ran (``None``: stock came back)."""
        self.report: ReclaimReport | None = None
        """The report the caller's hook or block returned (``None``: it has not returned)."""
        self._owner = _held(owner)
        self._token = token
        self._seam: Seam | None = None
        self._eviction: WeightEviction | None = None
        self._undo: list[Callable[[], None]] = []
        self._handed: list[ReclaimReport] = []  # every report handed out: each ends the start-up
        self._in_offer = False  # add_reclaimed is running (set by offer, cleared by offered)

    # -- the slot ---------------------------------------------------------------------------

    @classmethod
    def begin(cls, owner: object, token: object, wording: Wording) -> Startup | Busy:
        """BEGUN: this process's start-up, for ``owner``; or :class:`Busy` while one is active.

        ``token`` is the caller's own object: :meth:`leave` with it settles the start-up
        even if an exception cut this call short after the slot was taken.
        """
        made = cls(owner, token, wording)
        with cls._lock:
            if cls._active is None and not setattr(cls, "_active", made):  # type: ignore[func-returns-value]  # one line: see _move
                return made
            active = cls._active
            if active is None:  # a signal handler began and ended one between the two lines
                return Busy("a call that raced another start-up", "none, since ended")
            return Busy(active._how(owner), repr(active))

    def _how(self, owner: object) -> str:
        if self.phase is Phase.ENDING:
            return (
                "a call while the last start-up is ending (startup_complete came during its offer)"
            )
        if self._owner() is not owner and self.report is not None:
            return "a second model's call (another runtime's start-up is active)"
        if self.thread == threading.get_ident() and self.report is None:
            return "re-entrant call (from inside this start-up's own hook, e.g. its KV allocator)"
        if self.report is None:
            return "concurrent call (another thread is running before_first_capture)"
        return "repeated call (before_first_capture already ran in this start-up)"

    @classmethod
    @_resumed
    def leave(cls, token: object, report: ReclaimReport | None, escaped: bool) -> None:
        """The caller's exit: :meth:`settle` the start-up ``token`` began, if it is still active."""
        with cls._lock:
            active = cls._active
        if active is not None and active._token is token:
            active.settle(report, escaped)

    @classmethod
    def active(cls) -> Startup | None:
        """The start-up in progress in this process, if any."""
        return cls._active

    @classmethod
    def _after_fork_in_child(cls) -> None:
        """A fresh lock (its holder is not in the child); an offer's thread is not there either."""
        cls._lock = threading.RLock()
        active = cls._active
        if active is None or (active.thread == threading.get_ident() and not active._in_offer):
            return  # forked by the start-up's own thread, between its steps: all is as it was
        active._in_offer = False
        active._move(Phase.INSTALLING, Phase.INSTALLED)  # its installer is not in the child
        if active.phase is Phase.OFFERING:
            active.phase = Phase.CREDITED  # the child's allocator holds what the parent's did
        elif active.phase in (Phase.ENDING, Phase.BEGUN, Phase.INSTALLED):
            active._finish()  # ended in the parent, or its hook cannot finish here: nothing offered

    # -- transitions --------------------------------------------------------------------------

    def install(self, seam: Seam, eviction: WeightEviction) -> None:
        """BEGUN -> INSTALLED: b12x's races read ``eviction`` through ``seam``.

        Raises :class:`InstallError` if the start-up is no longer BEGUN (it ended, or
        ``restore()`` ran). b12x's modules are changed under the lock (no host code
        runs there), so another thread's restore waits for the whole change; a restore
        on this thread meanwhile (a signal handler) is finished once the change is whole.
        """
        with self._lock:
            if not self._move(Phase.BEGUN, Phase.INSTALLING):
                raise InstallError(
                    f"{self.wording.ends} ran, or restore() did, before the eviction was "
                    "installed; stock b12x kept"
                )
            self._seam, self._eviction = seam, eviction
            try:
                seam.install(eviction, self._undo)
            finally:
                whole = self._move(Phase.INSTALLING, Phase.INSTALLED)
        if not whole:
            self.restore()

    def _move(self, since: Phase, to: Phase) -> bool:
        """Compare-and-set the phase, under the lock the caller holds: the check and the write
        are one line, so a signal handler on this thread (which runs between lines, and may
        restore or end the start-up) cannot slip between them."""
        return self.phase is since and not setattr(self, "phase", to)  # type: ignore[func-returns-value]

    def keep(self) -> bool:
        """INSTALLED -> KEPT: the races read the weights until the end and nothing is credited
        (a host that sizes its KV cache by measurement); ``False`` if a restore or end came
        first."""
        with self._lock:
            return self._move(Phase.INSTALLED, Phase.KEPT)

    def agreement_round(self) -> int:
        """This start-up's number in the tensor-parallel agreement: every rank's n-th is alike."""
        with self._lock:
            return next(Startup._rounds)

    def offer(self, report: ReclaimReport) -> bool:
        """INSTALLED -> OFFERING: ``report``'s credit is recorded and may apply from now on.

        ``False`` (nothing recorded) if a restore or an end came first. The caller then
        hands ``report`` to the allocator, outside the lock, and calls :meth:`offered`.
        """
        with self._lock:
            # Written first, read only once the phase says OFFERING (audit, ends_with).
            self.offered_bytes, self._in_offer = report.reclaimed_bytes, True
            self._handed.append(report)
            if self._move(Phase.INSTALLED, Phase.OFFERING):
                return True
            self._in_offer = False
            return False

    @_resumed
    def offered(self, error: BaseException | None) -> None:
        """OFFERING -> CREDITED (ENDING -> ENDED): the allocator returned, or raised ``error``."""
        with self._lock:
            self._in_offer = False
            if error is not None and self.allocator_error is None:
                self.allocator_error = described(error, 500)
            self._move(Phase.OFFERING, Phase.CREDITED)
            ending = self.phase is Phase.ENDING
        if ending:
            self._finish()

    @_resumed
    def settle(self, report: ReclaimReport | None, escaped: bool) -> None:
        """The caller's exit: keep the install if and only if the offer began, else restore.

        ``escaped``: an exception leaves the caller; a start-up that offered nothing then
        ends too, so a retry begins anew. The caller has left the offer, whatever cut it
        short. Reads the phase, so a second call changes nothing.
        """
        with self._lock:
            if report is not None and self.report is None:
                self.report = report
            self._move(Phase.INSTALLING, Phase.INSTALLED)  # install() was cut short here
            self._move(Phase.OFFERING, Phase.CREDITED)  # offered() was cut short: it is over
            self._in_offer = False
            phase = self.phase
        if phase is Phase.ENDING or (escaped and phase not in _STANDS):
            self._finish()
        elif phase in (Phase.BEGUN, Phase.INSTALLED):
            self.restore()

    @_resumed
    def restore(self) -> None:
        """Stock b12x again, and no reference to the weights: the one place that undoes.

        Safe from any thread and from a signal handler; never raises an ``Exception``
        (an undo step that fails stays, is tried again by the next call, and its error is
        kept in :attr:`undo_error`); each step is dropped only once it ran.
        """
        with self._lock:
            if self.phase is Phase.INSTALLING:
                # A signal handler on the installing thread: install() restores once the
                # change is whole, since an undo that ran before its change undoes nothing.
                self.phase = Phase.FELL_BACK
                return
            self.phase = _AFTER_RESTORE.get(self.phase, self.phase)
            steps = list(self._undo)
        for step in reversed(steps):
            if not self._undone(step):
                continue
            with self._lock:
                if step in self._undo:
                    self._undo.remove(step)
        with self._lock:
            if not self._undo:
                self.undo_error = None
            eviction = self._eviction
        if eviction is not None:
            eviction.release()  # outside the lock: dropping a host tensor may run host code

    def _undone(self, step: Callable[[], None]) -> bool:
        """Run one undo step; whether it ran through. A step that raises runs once more (an
        exception a signal handler raised just before it is not the step's own); if it raises
        again (the fork's API refused None), it stays for the next restore and is named."""
        for attempt in (1, 2):
            try:
                step()
                return True
            except Exception as error:
                if attempt == 2:
                    self.undo_error = described(error, 500)
        return False

    def unheld(self) -> str | None:
        """Why a storage read is held by nothing but the eviction (``None``: the caller holds all).

        Collects the young generations first (microseconds; a full collection can take
        a second), so a copy kept only by a young reference cycle is not taken for the caller's.
        """
        gc.collect(1)
        eviction = self._eviction
        return None if eviction is None else eviction.unheld()

    # -- the end ------------------------------------------------------------------------------

    def owned_by(self, ender: object) -> bool:
        """Whether ``ender`` is this start-up's owner, or a report it handed out or returned."""
        if ender is None:
            return False
        handed = (*self._handed, self.report)
        return ender is self or ender is self._owner() or any(ender is r for r in handed)

    def ends_with(self, ender: object) -> bool:
        """Whether ``startup_complete(ender)`` ends this start-up: its owner or one of its
        reports always does; ``None``, or another owner once its own is gone, only while no
        credit stands."""
        if self.owned_by(ender):
            return True
        return self.phase not in _STANDS and (ender is None or self._owner() is None)

    @classmethod
    @_resumed
    def end(cls, ender: object, *, own_only: bool = False) -> StartupAudit:
        """``startup_complete(ender)``: the audit, stock b12x back, the slot free; or a refusal.

        Ends only the start-up ``ender`` ends (:meth:`ends_with`), else one line and
        nothing changes (``own_only``: silently, unless ``ender`` owns it). During the offer,
        the restore waits for the allocator to return. The audit line is logged even if an
        exception cuts the restore short. Never raises an ``Exception``: a fault is one line.
        """
        try:
            return cls._end(ender, own_only)
        except Exception as error:  # never the host's problem
            why = described(error, 500)
            say(log, logging.WARNING, "flare_l2evict: startup_complete failed: %s", why)
            return StartupAudit(mechanism="none", device=f"audit failed: {why}")

    @classmethod
    def _end(cls, ender: object, own_only: bool) -> StartupAudit:
        with cls._lock:
            active = cls._active
            if active is None or (own_only and not active.owned_by(ender)):
                return StartupAudit(mechanism="none")
            if active.phase is Phase.ENDED:  # another call is ending it right now
                return StartupAudit(mechanism="none")
            if not active.ends_with(ender):
                audit = StartupAudit(mechanism="none", refused=active._refusal(ender))
                say(log, logging.WARNING, "flare_l2evict: %s", audit.refused)
                return audit
            kept = active.phase not in (Phase.BEGUN, Phase.FELL_BACK, Phase.ENDED)
            audit = active.audit() if kept else StartupAudit(mechanism="none")
            active._move(Phase.OFFERING, Phase.ENDING)
        try:
            if active.phase is not Phase.ENDING:
                active._finish()
        finally:
            active._log_audit(audit)
        return audit

    @_resumed
    def _finish(self) -> None:
        """ENDED: restored, and the slot free for the next start-up. ENDED comes first, so an
        end on another thread meanwhile sees the start-up over (not cut short by a restore)."""
        with self._lock:
            self.phase = Phase.ENDED
        self.restore()
        with self._lock:
            if Startup._active is self:
                Startup._active = None

    def _refusal(self, ender: object) -> str:
        whose = "None" if ender is None else "a runtime that began no start-up in progress here"
        if self.phase is Phase.KEPT:
            active = "a start-up whose races read the weights (kv_sizing = 'measured') is active"
        elif self.phase in _STANDS:
            credit = self.audit().credited_bytes
            active = f"a start-up whose credit of {credit:,} bytes stands is active"
        else:
            active = "another model's start-up is running, with its own runtime"
        return (
            f"startup_complete with {whose} ({active}); this call changed nothing; fix: pass "
            "startup_complete the runtime its before_first_capture got, or the report that "
            "call returned"
        )

    def audit(self) -> StartupAudit:
        """What b12x asked of the seam so far, per device, and the credit it cost."""
        seam, eviction = self._seam, self._eviction
        if seam is None or eviction is None:
            return StartupAudit(mechanism="none")
        stands = self.phase in _STANDS
        key, credited = str(eviction.device), self.offered_bytes if stands else 0
        jobs = seam.basis.race_jobs if stands else 0
        made, fell_back = seam.stock_bytes(key), eviction.fell_back_reason
        if self.phase is Phase.CUT_SHORT:  # races after it make buffers the audit cannot see
            made = credited
            fell_back = (
                f"flare_l2evict.restore() ran before {self.wording.ends}, while the host "
                "relied on the eviction; any race after it allocates a stock buffer"
            )
        counted = seam.counted
        unused = max(0, jobs - seam.peak) * seam.basis.stock.nbytes if counted else 0
        devices = tuple(DeviceAudit(device=d, **asdict(c)) for d, c in sorted(seam.counts.items()))
        return StartupAudit(
            mechanism=seam.mechanism,
            device=key,
            credited_bytes=credited,
            race_jobs=jobs,
            peak_alive=seam.peak if counted else None,
            unused_credit_bytes=min(unused, credited),
            allocator_error=self.allocator_error,
            counted=counted,
            devices=devices,
            shortfall_bytes=min(made, credited),
            fallback_reason=fell_back,
        )

    def _log_audit(self, audit: StartupAudit) -> None:
        line = audit.summary(self.wording)
        if self.undo_error:
            line += f"; RESTORE FAILED: {self.undo_error} (stock b12x may not be back)"
        level = logging.WARNING if audit.warns or self.undo_error else logging.INFO
        say(log, level, "flare_l2evict: audit: %s", line)

    def __repr__(self) -> str:
        eviction = self._eviction
        if eviction is None:
            return f"Startup({self.phase.value}, nothing installed)"
        name = shown(repr(eviction.source_name), 120)
        mechanism = self._seam.mechanism if self._seam is not None else "none"
        state = (
            self.phase.value
            if self.phase in (Phase.FELL_BACK, Phase.ENDED)
            else (f"reads {eviction.read_bytes:,} bytes")
        )
        return f"Startup({mechanism}, {name} on {eviction.device}, {state})"


os.register_at_fork(after_in_child=Startup._after_fork_in_child)


def restore() -> None:
    """Put stock b12x back and release the weights, whatever is installed. Idempotent. While a
    credit stands, later races' stock buffers are the audit's SHORTFALL."""
    active = Startup.active()
    if active is not None:
        active.restore()
