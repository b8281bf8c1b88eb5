"""The one owner of the plugin's process state: the start-up in progress and what is installed.

Like pluggy's ``PluginManager``, one object (:data:`PROCESS`) holds every
piece of state the plugin keeps between calls; nothing else in the package
keeps any. Its invariants, which the KV allocator relies on:

* at most one start-up per process, and it belongs to the runtime that began
  it: only ``startup_complete`` with that runtime ends it;
* at most one installation per process (:attr:`Process.installed`), whoever
  made it; :meth:`Process.hold` refuses a second one;
* the lock is re-entrant, so a signal handler that runs ``startup_complete``
  on a thread that holds it does not deadlock, and it is made anew in a forked
  child, so a child forked while another thread held it does not block. It is
  held only for state changes, never across host code.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import InstallError
from ._text import shown

if TYPE_CHECKING:
    from ._install import Installation
    from ._report import ReclaimReport


@dataclass
class Startup:
    """One start-up: the runtime it belongs to, who runs it, what it installed and reported.

    The runtime is held weakly where it allows it, so a start-up that fell
    back keeps no host object alive; once that runtime is gone, the start-up
    belongs to whoever ends it.
    """

    owner: Callable[[], object]
    thread: int
    installation: Installation | None = None
    report: ReclaimReport | None = None

    @property
    def runtime(self) -> object:
        """The runtime that began it (``None`` once a weakly held one is gone)."""
        return self.owner()

    def belongs_to(self, runtime: object) -> bool:
        owner = self.owner()
        return owner is None or owner is runtime


def _held(runtime: object) -> Callable[[], object]:
    try:
        return weakref.ref(runtime)
    except TypeError:  # no __weakref__ slot: held strongly until startup_complete
        return lambda: runtime


class Process:
    """The plugin's state in this process (see the module docstring for its invariants)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.startup: Startup | None = None
        self.installed: Installation | None = None

    def after_fork_in_child(self) -> None:
        """A fresh lock: the thread that held the parent's does not exist in the child."""
        self.lock = threading.RLock()

    def begin(self, runtime: object) -> tuple[Startup, bool]:
        """The start-up for ``runtime``: a new one (``True``), or the one already running."""
        with self.lock:
            busy = self.startup
            if busy is not None:
                return busy, False
            self.startup = Startup(_held(runtime), threading.get_ident())
            return self.startup, True

    def current(self, startup: Startup) -> bool:
        """Whether ``startup`` is still this process's start-up (no ``startup_complete`` yet)."""
        with self.lock:
            return self.startup is startup

    def belongs_to(self, runtime: object) -> bool:
        """Whether the start-up in progress is the one ``runtime`` began."""
        with self.lock:
            return self.startup is not None and self.startup.runtime is runtime

    def end(self, runtime: object | None) -> tuple[Startup | None, str | None]:
        """End the start-up ``runtime`` began (any, for ``None``); why not, when it is not ended.

        Returns the start-up ended (``None`` when there was none) and, when
        the call belongs to no start-up in progress, the one-line reason it
        changed nothing.
        """
        with self.lock:
            startup = self.startup
            if startup is None or runtime is None or startup.belongs_to(runtime):
                self.startup = None
                return startup, None
        return None, (
            "startup_complete with a runtime that began no start-up in progress here (another "
            "model's start-up is running, with its own runtime); this call changed nothing; fix: "
            "pass startup_complete the runtime its before_first_capture got"
        )

    def hold(self, make: Callable[[], Installation]) -> Installation:
        """Install what ``make`` builds, or refuse: the caller owns exactly what it gets."""
        with self.lock:
            if self.installed is not None:
                raise InstallError(
                    f"{shown(repr(self.installed), 300)} is already active in this process; "
                    "fix: restore() it (or call startup_complete) before installing again"
                )
            self.installed = make()
            return self.installed

    def release(self, installation: Installation) -> None:
        """Forget ``installation`` once it is restored (only it: a later one stays)."""
        with self.lock:
            if self.installed is installation:
                self.installed = None


PROCESS = Process()
os.register_at_fork(after_in_child=PROCESS.after_fork_in_child)
