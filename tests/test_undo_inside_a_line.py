"""An undo step under whatever cuts in inside a line (issue 46): never lost, never run early.

CPython runs a pending signal handler after a C call returns, so a handler can land between
two C calls of one line. The start-up's undo bookkeeping moves a step by one store or one
C call at a time (``Startup._undo_step``); these tests cut in at every ``c_return`` of the
restore's own frames, and with a real ``SIGALRM`` every few microseconds.

Case -> outcome:

- an exception at any ``c_return`` of ``startup_complete``'s restore -> the seam is the
  plugin's only until the next ``restore()``, which puts stock back and frees the slot;
- ``restore()`` re-entered at any such point -> stock is back when the slot is free;
- a real ``SIGALRM`` whose handler raises, or calls ``restore()``, over tens of thousands of
  restores -> no step lost, no slot freed before its steps ran.

Stand-ins are named so; pluggy, the plugin, b12x's real seam and the start-up are real.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import pytest
from support.hosts import complete, hook, runtime, seam_is_ours

import flare_l2evict
from flare_l2evict._report import HOST
from flare_l2evict._startup import Startup

pytest.importorskip("b12x.preparation._measurement")

_RESTORE_CODES = frozenset(
    getattr(f, "__wrapped__", f).__code__
    for f in (Startup.restore, Startup._restore, Startup._undo_step, Startup._vacate)
)


class InterruptStandIn(KeyboardInterrupt):
    """What a signal handler raises inside a line: Ctrl-C, as the host sees it."""


def _c_returns(run: Callable[[], object], codes: frozenset[CodeType]) -> int:
    """How many C calls return inside ``codes``' frames while ``run`` runs."""
    seen = 0

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal seen
        if event == "c_return" and frame.f_code in codes:
            seen += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def _at_c_return(n: int, act: Callable[[], None], codes: frozenset[CodeType]) -> Any:
    """A profile function that runs ``act`` at the ``n``-th ``c_return`` in ``codes``' frames,
    as a signal handler runs there: what ``act`` raises goes into that frame."""
    count = 0

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal count
        if event == "c_return" and frame.f_code in codes:
            count += 1
            if count == n:
                act()

    return profile


_ARMED = [False]
"""Whether :func:`_interrupt` raises: only inside the calls under test, and once."""


def _interrupt() -> None:
    if _ARMED[0]:
        _ARMED[0] = False
        raise InterruptStandIn


@pytest.mark.slow
@pytest.mark.parametrize("act", [_interrupt, flare_l2evict.restore], ids=["raises", "restores"])
def test_whatever_cuts_in_after_any_c_call_of_a_restore_loses_no_undo_step(
    act: Callable[[], None],
) -> None:
    # At 49c0f1a a claim was two C calls (undo.remove, then taken.append): an exception
    # between them left the step in neither list, the slot was freed, and b12x's races
    # kept the plugin's eviction through every later restore().
    host = runtime()
    hook(host)
    points = _c_returns(lambda: complete(host), _RESTORE_CODES)
    assert points >= 5, points
    for n in range(1, points + 1):
        host = runtime()
        hook(host)
        assert seam_is_ours()
        _ARMED[0] = True
        sys.setprofile(_at_c_return(n, act, _RESTORE_CODES))
        try:
            complete(host)
        except InterruptStandIn:
            pass
        finally:
            sys.setprofile(None)
            _ARMED[0] = False
        if Startup.active() is None:  # the slot is free only once stock is back
            assert not seam_is_ours(), f"c_return {n} of {points}: slot freed, seam stranded"
        flare_l2evict.restore()  # what an operator runs after a Ctrl-C
        complete(host)
        assert not seam_is_ours(), f"c_return {n} of {points}: the seam stays the plugin's"
        assert Startup.active() is None, f"c_return {n} of {points}: {Startup.active()!r}"


class _SteppedSeamStandIn:
    """A seam of a few patches, each undone by a step that puts stock back (idempotent, as
    the real seam's are), registered before its change as the real seam registers them."""

    def __init__(self, undo: list[Callable[[], None]], steps: int) -> None:
        self.patched = [True] * steps
        for i in range(steps):
            undo.append(self._put_back(i))

    def _put_back(self, i: int) -> Callable[[], None]:
        def put_back() -> None:
            self.patched[i] = False

        return put_back


class _Owner:
    """The runtime that owns each start-up here (weakly held, as a host's)."""


def _restores_under_sigalrm(handler: Callable[[], None]) -> tuple[int, int]:
    """Start-ups undone by ``restore()`` and ended under a ``SIGALRM`` every 30 us calling
    ``handler``; returns (restores, signals that landed inside ``Startup._undo_step``).

    Fails if a step is lost (the seam stays patched once its start-up is over), or if the
    slot is freed by a handler's call while a step of its start-up has yet to run.
    """
    inside = Startup._undo_step.__code__
    hits = 0
    lost: list[str] = []
    seam: _SteppedSeamStandIn | None = None
    busy = False

    def on_alarm(_signum: int, frame: FrameType | None) -> None:
        nonlocal hits, busy
        if busy:  # the next alarm inside this handler: one level, as one Ctrl-C
            return
        busy = True
        try:
            _on_alarm(frame)
        finally:
            busy = False

    def _on_alarm(frame: FrameType | None) -> None:
        nonlocal hits
        f = frame
        while f is not None and f.f_code is not inside:
            f = f.f_back
        hits += f is not None
        active, patched = Startup.active(), seam
        handler()
        if active is not None and Startup.active() is None and patched and any(patched.patched):
            lost.append(f"slot freed by a handler's restore before {patched.patched} ran")

    runs = 0
    _ARMED[0] = False
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 30e-6, 30e-6)
    try:
        while runs < 40_000 and (runs < 2_000 or hits < 2_000):
            runs += 1
            owner = _Owner()
            began = Startup.begin(owner, owner, HOST)
            while not isinstance(began, Startup):  # a handler's restore is closing the last
                flare_l2evict.restore()
                began = Startup.begin(owner, owner, HOST)
            seam = _SteppedSeamStandIn(began._undo, 3)  # as the real seam registers its steps
            _ARMED[0] = True
            try:
                if runs % 2:  # an operator's restore() first; else startup_complete's alone
                    began.restore()
                Startup.end(owner)
                _ARMED[0] = False
            except InterruptStandIn:
                pass
            # Whatever was cut short, the next restore finishes it.
            began.restore()
            Startup.end(owner)
            if any(seam.patched) or Startup.active() is not None:
                lost.append(f"run {runs}: patched {seam.patched}, active {Startup.active()!r}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not lost, lost[:5]
    return runs, hits


@pytest.mark.slow
@pytest.mark.parametrize("handler", [_interrupt, flare_l2evict.restore], ids=["raises", "restores"])
def test_a_real_signal_inside_restores_loses_no_step_and_frees_no_slot_early(
    handler: Callable[[], None],
) -> None:
    runs, hits = _restores_under_sigalrm(handler)
    print(f"{runs} restores, {hits} signals inside _undo_step")
    assert hits >= 1_000, f"the signal landed inside _undo_step only {hits} times in {runs}"
