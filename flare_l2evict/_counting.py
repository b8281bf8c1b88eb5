"""The one lock the seams keep their counters under: b12x's races, and the timing calls of
the Triton wing, run on any thread. It guards a few integers, never a call, and is made anew
in a forked child (the thread that held it is not there). Read it as ``_counting.lock`` at
each use, so a child's new lock is the one taken."""

from __future__ import annotations

import os
import threading

lock = threading.Lock()


def _after_fork_in_child() -> None:
    global lock
    lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
