"""Reaching the process's start-up from tests: what is active, what it reads, ending it.

The runtime offers no affordance for tests (issue 34); these read the one owner,
:class:`flare_l2evict._startup.Startup`, from outside.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import Any

from flare_l2evict import StartupAudit
from flare_l2evict._eviction import WeightEviction
from flare_l2evict._startup import Phase, Startup

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
def restore_paused(code: CodeType, line: int | None = None) -> Iterator[None]:
    """An operator's ``flare_l2evict.restore()`` on another thread, paused at its first line
    event in ``code`` (at ``line``, if given), as a preemption would pause it there.

    Returns once it is paused; the block runs meanwhile, and on leaving it the restore goes
    on and its thread is joined.
    """
    import flare_l2evict

    paused, resume = threading.Event(), threading.Event()

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "line" and line in (None, frame.f_lineno) and not paused.is_set():
            paused.set()
            resume.wait(_DEADLINE)  # the scheduler preempts the operator's thread here
        return local

    def operator() -> None:
        sys.settrace(lambda frame, _event, _arg: local if frame.f_code is code else None)
        try:
            flare_l2evict.restore()
        finally:
            sys.settrace(None)

    other = threading.Thread(target=operator)
    other.start()
    try:
        assert paused.wait(_DEADLINE), "the operator's restore never reached its pause"
        yield
    finally:
        resume.set()
        other.join()


_DEADLINE = 120.0  # seconds a paused thread waits before it is called a hang
