"""Reaching the process's start-up from tests: what is active, what it reads, ending it.

The runtime offers no affordance for tests (issue 34); these read the one owner,
:class:`flare_l2evict._startup.Startup`, from outside.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from flare_l2evict import StartupAudit
from flare_l2evict._eviction import WeightEviction
from flare_l2evict._startup import Phase, Startup
from support.stops import Stop, Target

_HOLDING = frozenset(
    {Phase.INSTALLED, Phase.OFFERING, Phase.CREDITED, Phase.ENDING, Phase.KEPT, Phase.ORPHANED}
)
"""The phases in which an install stands: the races read the weights."""


def active() -> Startup | None:
    """The start-up in progress, if any."""
    return Startup.active()


def installed() -> Startup | None:
    """The active start-up if it holds an install (races read weights), else ``None``."""
    found = Startup.active()
    return found if found is not None and found.phase in _HOLDING else None


def eviction_of(startup: Startup) -> WeightEviction:
    """What the start-up's races run before each sample."""
    eviction = startup._eviction
    assert eviction is not None, startup
    return eviction


def end_any() -> StartupAudit:
    """End whatever start-up is active, as ``startup_complete`` with what ends it would."""
    found = Startup.active()
    if found is None:
        return StartupAudit(mechanism="none")
    for ender in (found._owner(), found.report, *found._handed, None):
        if found.ends_with(ender):
            return Startup.end(ender)
    raise AssertionError(f"nothing ends {found!r}")


@contextlib.contextmanager
def restore_paused(target: Target) -> Iterator[None]:
    """An operator's ``flare_l2evict.restore()`` on another thread, paused at the first hit of
    ``target``, as a preemption would pause it there.

    Returns once it is paused; the block runs meanwhile, and on leaving it the restore goes
    on and its thread is joined.
    """
    import flare_l2evict

    paused, resume = threading.Event(), threading.Event()

    def pause() -> None:
        paused.set()
        resume.wait(_DEADLINE)  # the scheduler preempts the operator's thread here

    stop = Stop(target, pause)
    other = threading.Thread(target=stop.run, args=(flare_l2evict.restore,))
    other.start()
    try:
        assert paused.wait(_DEADLINE), "the operator's restore never reached its pause"
        yield
    finally:
        resume.set()
        other.join()


_DEADLINE = 120.0  # seconds a paused thread waits before it is called a hang
