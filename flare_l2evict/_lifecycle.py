"""The one owner of the plugin's process state: the start-up in progress and what is installed.

Like pluggy's ``PluginManager``, :data:`PROCESS` holds every piece of state the
plugin keeps between calls. Its invariants, which the KV allocator relies on:

* at most one start-up per process, ended only by ``startup_complete`` with its
  runtime or its report (:meth:`Startup.ends_with`), never, while its credit
  stands, by another runtime, by ``None``, or because its runtime is gone;
* at most one installation per process (:meth:`Process.install` refuses a
  second), settled in one place (:meth:`Process.settle`);
* the lock is re-entrant (a signal handler running ``startup_complete`` does
  not deadlock), made anew in a forked child, and never held across host code.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import InstallError
from ._install import Installation, make_installation
from ._text import shown

if TYPE_CHECKING:
    from ._b12x.proof import CreditBasis
    from ._eviction import Kernel
    from ._report import ReclaimReport, Words
    from ._weights import WeightChoice


@dataclass
class Startup:
    """One start-up: its runtime (held weakly where it allows, so a start-up that fell back
    keeps no host object alive), who runs it, what it installed and reported."""

    owner: Callable[[], object]
    thread: int
    installation: Installation | None = None
    report: ReclaimReport | None = None

    @property
    def runtime(self) -> object:
        """The runtime that began it (``None`` once a weakly held one is gone)."""
        return self.owner()

    @property
    def credited(self) -> bool:
        """Whether a credit offered by this start-up stands (the allocator may have applied it)."""
        made = self.installation
        return made is not None and made.offered_bytes > 0

    def ends_with(self, runtime: object) -> bool:
        """Whether ``startup_complete(runtime)`` ends this start-up.

        Its own runtime, or the report its hook returned, always does; ``None``,
        another runtime once its own is gone, never while its credit stands.
        """
        owner = self.owner()
        if runtime is not None and (runtime is owner or runtime is self.report):
            return True
        return not self.credited and (runtime is None or owner is None)


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

    def settle(self, startup: Startup, report: ReclaimReport, escaped: bool) -> None:
        """The hook's one exit: keep the installation iff its credit was offered.

        ``escaped``: an exception leaves the hook; a start-up that offered nothing
        is then ended too, so a retry begins anew.
        """
        made = startup.installation
        if made is not None:
            made.settle()
        with self.lock:  # after the settling: a start-up ended here has nothing installed
            startup.report = startup.report or report
            if escaped and not startup.credited and self.startup is startup:
                self.startup = None

    def end(self, runtime: object | None, force: bool = False) -> tuple[Startup | None, str | None]:
        """End the start-up ``runtime`` ends (:meth:`Startup.ends_with`), or say why not
        (``force``, :func:`flare_l2evict.plugin.finish`: any)."""
        with self.lock:
            startup = self.startup
            if startup is None or force or startup.ends_with(runtime):
                self.startup = None
                return startup, None
            credit = startup.installation.offered_bytes if startup.installation else 0
        whose = "None" if runtime is None else "a runtime that began no start-up in progress here"
        active = (
            f"a start-up whose credit of {credit:,} bytes stands is active"
            if credit
            else "another model's start-up is running, with its own runtime"
        )
        return None, (
            f"startup_complete with {whose} ({active}); this call changed nothing; fix: pass "
            "startup_complete the runtime its before_first_capture got, or the report that "
            "call returned"
        )

    def install(
        self,
        choice: WeightChoice,
        basis: CreditBasis,
        words: Words,
        kernel: Kernel = "auto",
        startup: Startup | None = None,
    ) -> Installation:
        """Make b12x's races read ``choice`` (:func:`~._install.make_installation`), or refuse.

        Raises :class:`~flare_l2evict.InstallError` while an installation is active.
        It is recorded before b12x is changed, so its settling finds what to undo.
        """
        with self.lock:
            if self.installed is not None:
                raise InstallError(
                    f"{shown(repr(self.installed), 300)} is already active in this process; "
                    "fix: restore() it (or call startup_complete) before installing again"
                )
            made, apply = make_installation(choice, basis, self, words, kernel)
            self.installed = (startup or Startup(lambda: None, 0)).installation = made
            # Under the lock, so another thread's restore() waits for the whole patch; a
            # restore() on this thread meanwhile (a signal handler) is finished below.
            try:
                apply()
            finally:
                made.applying = False
                if made.restored:
                    made.settle()  # nothing is offered yet: settling restores
        return made

    def release(self, installation: Installation) -> None:
        """Forget ``installation`` once it is restored (only it: a later one stays)."""
        with self.lock:
            if self.installed is installation:
                self.installed = None


PROCESS = Process()
os.register_at_fork(after_in_child=PROCESS.after_fork_in_child)


def ensure_ended(runtime: object | None, force: bool) -> None:
    """End what ``startup_complete(runtime)`` ends, and what is installed once no start-up is
    (idempotent: ``startup_complete`` calls it last, from a ``finally``)."""
    PROCESS.end(runtime, force)
    with PROCESS.lock:
        made = PROCESS.installed if PROCESS.startup is None else None
    if made is not None:
        made.end()


def active_installation() -> Installation | None:
    """The installation in force in this process, if any."""
    return PROCESS.installed


def restore() -> None:
    """Put stock b12x back and release the weights, whatever is installed. Idempotent. While a
    credit stands, later races' stock buffers are the audit's SHORTFALL."""
    installation = PROCESS.installed
    if installation is not None:
        installation.restore()
