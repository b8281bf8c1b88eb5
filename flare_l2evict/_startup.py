r"""One start-up of the plugin in this process: its phase, its lock, its undo, its offer.

:class:`Startup` holds every piece of state the plugin keeps between calls, as pluggy's
``PluginManager`` does for a manager: the process's one start-up slot and lock, and per
start-up its :class:`Phase`, the seams' undo steps, the offer and the agreement round. Its
seams are b12x's, the one credited, and the wings installed after it (Triton's, a
:class:`Wing`), whose undo steps are more steps of the one restore. Each method takes one
:class:`Event` under the lock, and the lock guards only the plugin's own fields: nothing
that can run host code runs under it. Not the KV allocator (called between
:meth:`Startup.offer` and :meth:`Startup.offered`), not the change of a seam
(:meth:`Startup.install`: ``torch.device``, which a host's ``TorchFunctionMode`` sees, or
the fork's API), not an undo step, the text of a host's exception, a log line (its handlers
are the host's), nor the drop of a host object. A host lock taken in any of those (a
profiler's mode) cannot deadlock against a host thread that holds it while it calls
``startup_complete`` or ``restore()``. (What CPython itself runs on this thread, inside a
line as well as between two: a signal handler after any call returns, a ``gc.callbacks``
hook, a trace or profile callback, is outside any library's say: the lock is re-entrant for
it, and every move of state is one write or one C call; docs/guarantees.md.) The parts below
(basis, choice, eviction, seam, credit, agreement, report) are passive: none imports this
module or calls back into it.

The phase moves only through :data:`NEXT`, a table of (phase, event) -> next phase,
applied by :meth:`Startup._step`, which raises on a pair the table does not have (as
h11's ``_state.py`` does). :data:`_MOVES` lists every move, one per line, in the
form ``docs/internals.md`` draws them (a test holds the two to the table).

Every other pair in the table leaves the phase as it is: a restore or an end came
first (an ``offer`` after a restore is refused), or the event has nothing left to do.

What follows a move is read off the phase it lands on, in one place
(:meth:`Startup._after`, as h11's ``_fire_state_triggered_transitions``): FELL_BACK and
ENDED put stock b12x back, and ENDED frees the slot too. INSTALLING, FALLING_BACK and
ENDING are the start-up's own thread inside a step (changing b12x, or in the allocator's
``add_reclaimed``): a restore or an end that arrives then (from a signal handler on that
thread, or from another thread) is recorded in the phase, and the step carries it out as
it leaves. So no undo runs between a change's registration and the change itself.

Invariants the KV allocator relies on:

* at most one start-up per process; it ends only by ``startup_complete`` with its
  owner (the runtime, or the block) or with a report it handed out, never, while
  its credit stands, by another runtime or by ``None``;
* nothing stays installed that is not credited: the caller's exit (:meth:`settle`)
  restores unless the offer began (or a measuring host's keep: KEPT, and ORPHANED when an
  exception cut its hook short, which :meth:`restore` ends); a credit stays backed until
  its start-up ends (from OFFERING on only :meth:`end`, or an operator's :func:`restore`,
  audited as SHORTFALL, undoes the install);
* :meth:`restore` is the one place that puts stock b12x back. It reads the phase, so
  calling it again is harmless, and it resumes by itself what an exception cut short.
  Each undo step is claimed under the lock and run outside it; the slot is not freed
  while a claimed step has yet to run, so a stale restore never undoes the next
  start-up's install.
"""

from __future__ import annotations

import enum
import functools
import gc
import itertools
import logging
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any, ClassVar, ParamSpec, Protocol, TypeVar

from pydantic import BaseModel

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
    """Where a start-up is; the module docstring lists the moves."""

    # Identity hashing, in C: a table lookup runs no Python code a signal handler could enter.
    __hash__ = object.__hash__

    BEGUN = "begun"  # the slot is taken; b12x is as it was
    INSTALLING = "installing"  # the seam is being changed (each undo registered first)
    FALLING_BACK = "falling back"  # restore() came mid-change: undone once the change is over
    INSTALLED = "installed"  # races read the weights; nothing offered yet
    OFFERING = "offering"  # the credit is recorded; add_reclaimed runs (it may apply it)
    CREDITED = "credited"  # the offer is over: kept until the start-up ends
    KEPT = "kept"  # installed for a host that sizes its KV cache by measurement: no credit
    ORPHANED = "orphaned"  # KEPT, but an exception cut the hook short: the host has no report
    ENDING = "ending"  # startup_complete came mid-change or mid-offer: ended as the step leaves
    CUT_SHORT = "cut short"  # restore() while the credit stood: later races make stock buffers
    FELL_BACK = "fell back"  # stock b12x is back; nothing credited
    ENDED = "ended"  # over: stock b12x, no reference to the weights, the slot free


class Event(enum.Enum):
    """What happens to a start-up: each :class:`Startup` method takes one."""

    __hash__ = object.__hash__  # as Phase's

    INSTALL = "install"  # install() begins changing b12x
    INSTALLED = "installed"  # install() leaves: the change is over, whole or cut short
    KEEP = "keep"  # a measuring host keeps the install, uncredited
    OFFER = "offer"  # the credit is recorded and handed to the allocator
    OFFERED = "offered"  # the allocator returned (or raised)
    RESTORE = "restore"  # stock b12x back (restore(), or a fallback)
    END = "end"  # startup_complete that ends this start-up (or the caller's own end)
    SETTLE = "settle"  # the caller's exit: its install and its offer are over
    ESCAPE = "escape"  # ... and an exception leaves the caller: the host gets no report
    FORKED = "forked"  # a child process, without the thread that ran the start-up


def _table(moves: str, stays: dict[Event, frozenset[Phase]]) -> dict[tuple[Phase, Event], Phase]:
    """The table from :data:`_MOVES`' lines, plus the pairs that leave the phase as it is."""
    table: dict[tuple[Phase, Event], Phase] = {}
    for line in moves.strip().splitlines():
        since, name, to = line.replace("--", " ").replace(">", " ").split()
        table[Phase[since], Event[name.upper()]] = Phase[to]
    for event, phases in stays.items():
        for phase in phases:
            table.setdefault((phase, event), phase)
    return table


_MOVES = """
    BEGUN         --install-->    INSTALLING
    BEGUN         --restore-->    FELL_BACK
    BEGUN         --end-->        ENDED
    BEGUN         --forked-->     ENDED
    BEGUN         --settle-->     FELL_BACK
    INSTALLING    --installed-->  INSTALLED
    INSTALLING    --settle-->     FELL_BACK
    INSTALLING    --restore-->    FALLING_BACK
    INSTALLING    --end-->        ENDING
    INSTALLING    --forked-->     ENDED
    FALLING_BACK  --installed-->  FELL_BACK
    FALLING_BACK  --settle-->     FELL_BACK
    FALLING_BACK  --end-->        ENDING
    FALLING_BACK  --forked-->     ENDED
    INSTALLED     --keep-->       KEPT
    INSTALLED     --settle-->     FELL_BACK
    INSTALLED     --offer-->      OFFERING
    INSTALLED     --restore-->    FELL_BACK
    INSTALLED     --end-->        ENDED
    INSTALLED     --forked-->     ENDED
    OFFERING      --offered-->    CREDITED
    OFFERING      --settle-->     CREDITED
    OFFERING      --restore-->    CUT_SHORT
    OFFERING      --end-->        ENDING
    OFFERING      --forked-->     CREDITED
    CREDITED      --restore-->    CUT_SHORT
    CREDITED      --end-->        ENDED
    KEPT          --restore-->    CUT_SHORT
    KEPT          --end-->        ENDED
    FELL_BACK     --escape-->     ENDED
    KEPT          --escape-->     ORPHANED
    ORPHANED      --restore-->    ENDED
    ORPHANED      --end-->        ENDED
    ENDING        --installed-->  ENDED
    ENDING        --offered-->    ENDED
    ENDING        --settle-->     ENDED
    ENDING        --forked-->     ENDED
    CUT_SHORT     --end-->        ENDED
    FELL_BACK     --end-->        ENDED
"""
"""Every move of the phase, ``PHASE --event--> NEXT``; any other pair in :data:`NEXT` stays."""

# The phase sets the methods test, each named once.
_ALL = frozenset(Phase)
_OVER = frozenset({Phase.FELL_BACK, Phase.ENDED})
"""Stock b12x is back (or going back) and nothing is credited: an install, a keep or an offer
is refused, and what follows a move here is a restore (:meth:`Startup._after`)."""
_UNAUDITED = frozenset({Phase.BEGUN, *_OVER})
"""An end has nothing to audit: nothing was installed, or it was undone with nothing
credited, or another call is closing the start-up."""
_MEASURED = frozenset({Phase.KEPT, Phase.ORPHANED})
"""Installed for a host that sizes its KV cache by measurement: nothing credited."""
_STANDS = frozenset({Phase.OFFERING, Phase.CREDITED, Phase.ENDING, Phase.CUT_SHORT, *_MEASURED})
"""Phases in which the host relies on the install: its allocator may hold the credit, or
(:data:`_MEASURED`) its measured KV cache counts on the races reading weights."""
_MID_STEP = frozenset({Phase.INSTALLING, Phase.FALLING_BACK, Phase.ENDING})
"""The start-up's own thread is inside a step: what a restore asks for waits for it to leave."""
_OFFER_OVER = frozenset({Phase.CREDITED, Phase.CUT_SHORT, Phase.ENDED})
"""The allocator's call is over, or a second run of its transition has nothing left to do."""

NEXT = _table(
    _MOVES,
    {
        # Refused: a restore or an end came first.
        Event.INSTALL: _OVER,
        Event.KEEP: _OVER,
        Event.OFFER: _OVER,
        Event.OFFERED: _OFFER_OVER,
        # Whatever the phase: these never raise.
        Event.RESTORE: _ALL,
        Event.END: _ALL,
        Event.SETTLE: _ALL,
        Event.ESCAPE: _ALL,
        Event.FORKED: _ALL,
    },
)
"""(phase, event) -> the next phase: every move a start-up can make, and nothing else."""


class Wing(Protocol):
    """A seam installed beside b12x's in the same start-up, whatever library it serves: its
    undo steps go in the start-up's one list, before each change, and its own failures are
    its own (it returns normally; only an interrupt goes up). Never credited: it fills one
    field of the audit, ``section``."""

    section: str

    def install(self, eviction: WeightEviction, undo: list[Callable[[], None]]) -> None: ...

    def audited(self) -> BaseModel: ...


class PhaseError(RuntimeError):
    """An event in a phase the table has no move for: a bug in the plugin, never the host's."""


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


class _Call:
    """One :meth:`Startup.restore` call, for its claims on undo steps: a claim stands while
    its call runs, and is taken over once the call has left (:func:`_left`)."""

    __slots__ = ("__weakref__", "frame", "ref", "thread")

    def __init__(self, frame: FrameType) -> None:
        self.frame: FrameType | None = frame
        """``restore()``'s own frame: the call runs while it is on its thread's stack."""
        self.thread = threading.get_ident()
        self.ref: weakref.ref[_Call] = weakref.ref(self)


def _left(held: weakref.ref[_Call]) -> bool:
    """Whether the call behind a claim has left: its ``restore()`` frame is no longer on its
    thread's stack. Read off the stacks, never off a word the call stores as it leaves: a cut
    can skip a store (a trace callback's exception), and a host that keeps the exception keeps
    the call alive. After a fork, the other threads' calls are gone with their threads."""
    call = held()
    frame = None if call is None else call.frame
    if call is None or frame is None:
        return True
    running = sys._current_frames().get(call.thread)
    while running is not None:
        if running is frame:
            return False
        running = running.f_back
    return True


class Startup:
    """One start-up, from :meth:`begin` to :meth:`end` (see the module docstring)."""

    _lock: ClassVar[threading.RLock] = threading.RLock()
    _active: ClassVar[Startup | None] = None
    _rounds: ClassVar[Iterator[int]] = itertools.count()

    def __init__(self, owner: object, token: object, wording: Wording) -> None:
        self.phase = Phase.BEGUN  # not a move: the start-up does not exist before this line
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
        self._wings: tuple[Wing, ...] = ()  # installed after b12x's seam, never credited
        self._eviction: WeightEviction | None = None
        self._undo: list[Callable[[], None]] = []  # registered by the seam; dropped once run
        # Who runs a registered step outside the lock: step -> that restore call. A claim is
        # one store, and a claimed step stays registered until it ran (see _undo_step).
        self._claims: dict[Callable[[], None], weakref.ref[_Call]] = {}
        # Registered steps whose last run raised twice: the slot is freed with only these left.
        self._failed: set[Callable[[], None]] = set()
        self._handed: list[ReclaimReport] = []  # every report handed out: each ends the start-up

    def _step(self, event: Event) -> Phase:
        """The one place the phase moves: ``event`` in the current phase, by :data:`NEXT`.

        Returns the phase it lands on. The read and the write are one table lookup and one
        store, with no call between them, so a signal handler on this thread (which runs
        after a call returns, and may restore or end the start-up) runs before the move or
        after it, never inside. Raises :class:`PhaseError` for a pair the table does not have.
        """
        try:
            self.phase = now = NEXT[(was := self.phase), event]
        except KeyError:
            raise PhaseError(f"{event.value} in phase {was.value}: not in the table") from None
        return now

    # -- the slot ---------------------------------------------------------------------------

    @classmethod
    def begin(cls, owner: object, token: object, wording: Wording) -> Startup | Busy:
        """BEGUN: this process's start-up, for ``owner``; or :class:`Busy` while one is active.

        ``token`` is the caller's own object: :meth:`leave` with it settles the start-up
        even if an exception cut this call short after the slot was taken.
        """
        made = cls(owner, token, wording)
        with cls._lock:
            if cls._active is None and not setattr(cls, "_active", made):  # type: ignore[func-returns-value]  # one C call after the test: see _step
                return made
            active = cls._active
        if active is None:  # a signal handler began and ended one between the two lines
            return Busy("a call that raced another start-up", "none, since ended")
        return Busy(active._how(owner, wording), repr(active))  # outside the lock

    def _how(self, owner: object, wording: Wording) -> str:
        """How a call of ``owner`` (in ``wording``) relates to this, the active start-up."""
        if self.phase is Phase.ENDED:
            return (
                "a call while the last start-up is closing (an undo step of its restore is "
                "still running)"
            )
        if self.phase is Phase.ENDING:
            return (
                "a call while the last start-up is ending (startup_complete came during its "
                "install or its offer)"
            )
        if self.phase is Phase.ORPHANED:
            return (
                "a call while a start-up whose hook an exception cut short stays installed "
                "for a measuring host (flare_l2evict.restore() or its startup_complete ends it)"
            )
        if self.wording.kind != wording.kind:  # a block's or a tools install's, not a model's
            return f"{wording.kind} ({self.wording.kind} is active)"
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
        """A fresh lock (its holder is not in the child); the start-up's thread may not be there.

        Forked by the start-up's own thread, the child goes on with its step as it was.
        """
        cls._lock = threading.RLock()
        active = cls._active
        if active is None:
            return
        # The threads that claimed undo steps are not in the child: their calls have left
        # there (_left reads the stacks), so the child's next restore takes their steps over;
        # this thread's own claim, if it forked inside an undo step, stands while it runs.
        if active.thread == threading.get_ident():
            return
        active._after(active._step(Event.FORKED))

    # -- transitions --------------------------------------------------------------------------

    def install(self, seam: Seam, eviction: WeightEviction, wings: Sequence[Wing] = ()) -> None:
        """BEGUN -> INSTALLED: b12x's races read ``eviction`` through ``seam``, the one
        credited, and each of ``wings`` after it reads the same eviction its own way.

        Raises :class:`InstallError` if the start-up is no longer BEGUN (it ended, or
        ``restore()`` ran). The seams are changed outside the lock (b12x's change calls
        ``torch.device``, which a host's torch mode sees, or the fork's API): a restore or
        an end that arrives meanwhile, from any thread, is recorded (FALLING_BACK,
        ENDING) and carried out here once the change is over, so no undo runs before its
        change. Every seam's undo steps land in the one list :meth:`restore` runs.
        """
        seams: tuple[Seam | Wing, ...] = (seam, *wings)
        with self._lock:
            if (now := self._step(Event.INSTALL)) is Phase.INSTALLING:
                self._seam, self._eviction, self._wings = seam, eviction, tuple(wings)
        if now is not Phase.INSTALLING:
            raise InstallError(
                f"{self.wording.ends} ran, or restore() did, before the eviction was "
                "installed; stock b12x kept"
            )
        try:
            for each in seams:
                each.install(eviction, self._undo)
        finally:
            with self._lock:
                now = self._step(Event.INSTALLED)
        self._after(now)

    def keep(self) -> bool:
        """INSTALLED -> KEPT: the races read the weights until the end and nothing is credited
        (a host that sizes its KV cache by measurement); ``False`` if a restore or end came
        first."""
        with self._lock:
            return self._step(Event.KEEP) is Phase.KEPT

    def agreement_round(self) -> int:
        """This start-up's number in the tensor-parallel agreement: every rank's n-th is alike."""
        with self._lock:
            return next(Startup._rounds)

    def offer(self, report: ReclaimReport) -> bool:
        """INSTALLED -> OFFERING: ``report``'s credit is recorded and may apply from now on.

        ``False`` (nothing recorded) if a restore or an end came first. The caller then
        hands ``report`` to the allocator, outside the lock, and calls :meth:`offered`.
        """
        nbytes = report.reclaimed_bytes
        with self._lock:
            # Written first, read only once the phase says OFFERING (audit, ends_with).
            self.offered_bytes = nbytes
            self._handed.append(report)
            return self._step(Event.OFFER) is Phase.OFFERING

    @_resumed
    def offered(self, error: BaseException | None) -> bool:
        """OFFERING -> CREDITED (ENDING -> ENDED): the allocator returned, or raised ``error``.

        Returns whether the start-up ended during the offer (``startup_complete`` inside the
        allocator's call): it is closed here, and its audit was logged already.
        """
        why = None if error is None else described(error, 500)  # the host's __str__: unlocked
        with self._lock:
            if why is not None and self.allocator_error is None:
                self.allocator_error = why
            now = self._step(Event.OFFERED)
        self._after(now)
        return now is Phase.ENDED

    @_resumed
    def settle(self, report: ReclaimReport | None, escaped: bool) -> None:
        """The caller's exit: keep the install if and only if the offer began, else restore.

        ``escaped``: an exception leaves the caller; a start-up that installed nothing for
        the host then ends too, so a retry begins anew; one kept for a measuring host is
        ORPHANED (kept, but :meth:`restore` ends it: the host never got its report); a credit
        the allocator may hold stands. The caller has left its install and its offer,
        whatever cut them short. Reads the phase, so a second call changes nothing.
        """
        with self._lock:
            if report is not None and self.report is None:
                self.report = report
            now = self._step(Event.SETTLE)
            if escaped:
                now = self._step(Event.ESCAPE)
        self._after(now)

    def _after(self, now: Phase) -> None:
        """What follows a move, read off the phase it landed on: the one place that decides
        it. :data:`_OVER` (FELL_BACK, ENDED) puts stock b12x back, and an ENDED start-up's
        restore frees the slot (:meth:`_vacate`); no other phase has anything to follow."""
        if now in _OVER:
            self.restore()

    def restore(self) -> None:
        """Stock b12x again, and no reference to the weights: the one place that undoes.

        Safe from any thread and from a signal handler; never raises an ``Exception``
        (an undo step that fails stays for the next call while the start-up holds the slot,
        and its error is kept in :attr:`undo_error`); each step is dropped only once it
        ran. Each step is claimed under the lock and run outside it (an undo step is
        b12x's code, or the fork's API). Inside a step of the start-up's own thread
        (:data:`_MID_STEP`) it is recorded, and that step restores as it leaves. An ENDED
        start-up's slot is freed here, once no undo step claimed by a call still running is
        left to run.
        """
        call = _Call(sys._getframe())  # this call's claim on the steps it runs
        try:
            self._restore(call)
        finally:
            call.frame = None  # left (were this skipped, its frame is off the stack anyway)

    @_resumed
    def _restore(self, call: _Call) -> None:
        """:meth:`restore`, as ``call``: a second run (after an exception) finishes its claims."""
        with self._lock:
            if self._step(Event.RESTORE) in _MID_STEP:
                return
            eviction = self._eviction
        while steps := self._left_to_run(call):
            for step in steps:
                self._undo_step(call, step)
        with self._lock:
            if not self._undo:
                self.undo_error = None
        if eviction is not None:
            eviction.release()  # outside the lock: dropping a host tensor may run host code
        self._vacate()

    def _undo_step(self, call: _Call, step: Callable[[], None]) -> None:
        """Run ``step`` outside the lock if ``call`` claims it and it is still registered.

        Every move here is one store or one C call, so whatever cuts in between two of them
        (a signal handler, at a line or after a C call returns; another thread, once the lock
        is let go) finds the step in one of three states and nowhere else: registered and
        unclaimed, claimed (by a call that runs or will run it; a claim whose call has left
        is taken over), or run and unregistered. A step is never in neither place, so it is
        never lost, and a claim stands until its call has run the step or left.
        """
        undo, claims, failed, mine = self._undo, self._claims, self._failed, call.ref
        with self._lock:
            # One C call: the claim is made, or the one that stands is returned.
            held = claims.setdefault(step, mine)
            if held is not mine and _left(held):
                # Its call left before running it (an exception cut it short twice): this
                # call takes it. One store; a handler that cut in before it ran the step
                # already, which the "still registered" test below then sees.
                claims[step] = held = mine
            run = held is mine and step in undo
        if held is not mine:
            return  # another call, still running, has it: the slot waits for that call
        ran = gave_up = False
        try:
            ran = run and self._undone(step)
            gave_up = run and not ran  # it raised twice, an Exception each time
        finally:
            with self._lock:
                if ran and step in undo:
                    undo.remove(step)  # one C call: unregistered once it ran
                if ran or gave_up:  # one C call each: a step cut short is neither
                    failed.add(step) if gave_up else failed.discard(step)
                # The claim last: until here the step was registered or claimed. Nothing
                # else moves a claim of a call still running; one left behind by a cut here
                # is dropped by _vacate (its step is gone) or taken over.
                if claims.get(step) is mine:
                    claims.pop(step, None)  # _vacate may have dropped it since: it had run

    def _left_to_run(self, call: _Call) -> list[Callable[[], None]]:
        """The registered steps ``call`` has yet to try, newest first: every one that has not
        failed, and is unclaimed, claimed by ``call`` itself (a first run an exception cut
        short), or claimed by a call that left. A step another call skipped (claimed then)
        and its claimant dropped unrun (an interrupt cut it) is among them."""
        mine = call.ref
        with self._lock:
            claims, failed = self._claims, self._failed
            return [
                step
                for step in self._undo[::-1]
                if step not in failed
                and ((held := claims.get(step)) is None or held is mine or _left(held))
            ]

    def _vacate(self) -> None:
        """An ENDED start-up frees the slot once every step still registered has failed (it
        raised twice, and is named in :attr:`undo_error`) and none is claimed by a call that is
        still running (that call frees it as it leaves); it drops the failed steps then. Never
        a step that was merely cut short: the next start-up installs after every undo of this
        one, never before a stale one."""
        with self._lock:
            claims, failed = self._claims, self._failed
            over = self.phase is Phase.ENDED and all(
                step in failed and ((held := claims.get(step)) is None or _left(held))
                for step in list(self._undo)
            )
            if over:
                self._undo.clear()  # none claimable now
                claims.clear()
                failed.clear()
            # One line, compare and clear: a signal handler that ended this start-up and began
            # the next between a check and a write would have its slot cleared.
            over and Startup._active is self and setattr(Startup, "_active", None)  # type: ignore[func-returns-value]

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

    def awaits_offer(self) -> bool:
        """Whether the install stands with nothing offered or kept yet: no end and no restore
        came since it (INSTALLED), so the hook may still offer its credit or keep it."""
        return self.phase is Phase.INSTALLED

    def ending(self) -> bool:
        """Whether an end came during a step of the start-up's own thread (ENDING), which ends
        the start-up as it leaves: an offer's credit then goes to a start-up that is over."""
        return self.phase is Phase.ENDING

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
        nothing changes (``own_only``: silently, unless ``ender`` owns it). Inside a step of
        the start-up's own thread (the install, the offer) the end is recorded (ENDING) and
        that step closes as it leaves. The audit line is logged even if an exception cuts
        the close short. Never raises an ``Exception``: a fault is one line.
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
            ended = active.phase is Phase.ENDED  # another call is closing it, or was cut short
            refused = not ended and not active.ends_with(ender)
            if refused:
                audit = StartupAudit(mechanism="none", refused=active._refusal(ender))
            else:
                audited = active.phase not in _UNAUDITED
                audit = active.audit() if audited else StartupAudit(mechanism="none")
                now = active._step(Event.END)
        if refused:  # logged outside the lock: a log handler is the host's code
            say(log, logging.WARNING, "flare_l2evict: %s", audit.refused)
            return audit
        if ended:
            active._after(Phase.ENDED)  # idempotent: finishes what the first call began
            return audit
        try:
            active._after(now)
        finally:
            active._log_audit(audit)
        return audit

    def _refusal(self, ender: object) -> str:
        whose = "None" if ender is None else "a runtime that began no start-up in progress here"
        if self.phase in _MEASURED:
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
        sections: dict[str, Any] = {wing.section: wing.audited() for wing in self._wings}
        unused = max(0, jobs - seam.peak) * seam.basis.stock.nbytes if counted else 0
        devices = tuple(DeviceAudit(device=d, **asdict(c)) for d, c in sorted(seam.counts.items()))
        offered = self._handed[-1] if stands and self._handed else None  # what the offer said
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
            device_free_bytes=None if offered is None else offered.device_free_bytes,
            uncut_credit_bytes=None if offered is None else offered.uncut_credit_bytes,
            **sections,
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
            self.phase.value if self.phase in _OVER else (f"reads {eviction.read_bytes:,} bytes")
        )
        return f"Startup({mechanism}, {name} on {eviction.device}, {state})"


os.register_at_fork(after_in_child=Startup._after_fork_in_child)


def restore() -> None:
    """Put stock b12x back and release the weights, whatever is installed. Idempotent. While a
    credit stands, later races' stock buffers are the audit's SHORTFALL."""
    active = Startup.active()
    if active is not None:
        active.restore()


def end_dropped(ender: object, line: str, dropped: str) -> None:
    """End the active start-up that ``ender`` owns (:meth:`Startup.owned_by`), whose holder was
    dropped before it ended it: one WARNING ``line`` (its ``%s`` the start-up), the end, then a
    ``ResourceWarning`` that names it as ``dropped`` (as ``TemporaryDirectory`` does), so a test
    that drops one fails under ``-W error::ResourceWarning``. A start-up already over (its
    holder's end ran) is gone silently. Called from a holder's ``weakref.finalize``."""
    active = Startup.active()
    if active is None or not active.owned_by(ender):
        return
    name = repr(active)
    say(log, logging.WARNING, line, name)
    Startup.end(ender, own_only=True)
    # The finalizer's frame, as its own warnings.warn(stacklevel=2) named it.
    warnings.warn(f"implicitly ended {name}: {dropped}", ResourceWarning, stacklevel=3)
