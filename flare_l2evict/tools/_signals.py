"""The signal rules of every command: the CLI's, ``example``'s writer's and the bench's.

Ctrl-C (SIGINT) and SIGTERM end a command with one line and exit 130, or, once its result
is settled, not at all: it ends with its own output and code. The rules, each in one place:

- Only a handler Python set and the caller did not ignore is ever changed
  (:func:`changeable`): a signal ignored by the caller (``cmd &`` from a script, nohup)
  stays ignored, and a C host's own handler (``getsignal`` says ``None``) is left alone.
- SIGTERM unwinds as Ctrl-C does (:func:`interrupt`), so temporary files go on the way out.
- :func:`held` blocks both in the signal mask and delivers them as it ends: what runs under
  it is never cut, whatever it is made of. Every import a command makes runs under it
  (:func:`of_a_command`): a Ctrl-C inside torch's import was swallowed, or turned into an
  ``ImportError`` or an abort, and one inside a module that builds a class with ``exec``
  (dataclasses, pydantic) made CPython 3.11 end the process by SIGINT, whatever its code.
- Handlers are put back under :func:`held`, all at once: nothing lands between two of them.
- :func:`settled`: the result is final; both are ignored until the command returns, so an
  output that is complete ends with the exit code it states. A command that runs as the
  process keeps them ignored to its exit: the interpreter's own exit cannot cut it either.

Signals reach the main thread only; off it, nothing here changes anything.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the console script imports this before anything: it imports little
    from collections.abc import Callable, Iterator
    from types import FrameType
    from typing import Any, TypeAlias

    Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | None

HANDLED: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
"""The signals a command answers with one line and exit 130."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def changeable(numbers: tuple[int, ...] = HANDLED) -> dict[int, Handler]:
    """The handlers of ``numbers`` a command may change, as they are now: not one its caller
    ignores (that stays ignored), nor one Python cannot see (``None``: a C host's own
    handler, which Python could not put back)."""
    handlers = {number: signal.getsignal(number) for number in numbers}
    return {n: h for n, h in handlers.items() if h is not None and h is not signal.SIG_IGN}


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Ctrl-C and SIGTERM blocked for the body, and delivered as it ends (to the handlers then).

    Blocked, not caught: no code under it, Python's or a C library's, can see, swallow or be
    cut by them. A process the body starts inherits the mask, so the body must not start
    one that lives on. A C host's own handler (``None``) is left alone; an ignored signal
    blocked here is still ignored as it ends.
    """
    numbers = {n for n in HANDLED if signal.getsignal(n) is not None} if _main_thread() else set()
    if not numbers or not hasattr(signal, "pthread_sigmask"):  # Windows: no signal mask
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, numbers)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _imports_held() -> Iterator[None]:
    """Every ``import`` statement of the main thread runs :func:`held` (the outermost one of
    a nest: its inner ones run as they are), and what it brings is delivered after it."""
    original = builtins.__import__
    depth = 0

    def held_import(*args: Any, **kwargs: Any) -> Any:
        nonlocal depth
        if depth or not _main_thread():
            return original(*args, **kwargs)
        depth += 1
        try:
            with held():
                return original(*args, **kwargs)
        finally:
            depth -= 1

    builtins.__import__ = held_import
    try:
        yield
    finally:
        if builtins.__import__ is held_import:  # not if another hand has replaced it since
            builtins.__import__ = original


def put_back(handlers: dict[int, Handler]) -> None:
    """Each of ``handlers`` set again, all under :func:`held`: a signal that arrives meanwhile
    reaches the handler put back, never one of the two half-restored states."""
    with held():
        for number, handler in handlers.items():
            signal.signal(number, handler)


def interrupt(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM's handler while a command runs: it unwinds as Ctrl-C does."""
    raise KeyboardInterrupt(signum)


class Command:
    """One command's run, as :func:`of_a_command` gives it: the handlers it may change, as
    they were (put back as it ends); whether it runs as the process (its exit is the
    process's) or for a caller; and whether its result is settled."""

    __slots__ = ("handlers", "process", "settled")

    def __init__(self, handlers: dict[int, Handler], process: bool) -> None:
        self.handlers = handlers
        self.process = process
        self.settled = False

    def settle(self) -> None:
        """The result is final: Ctrl-C and SIGTERM are ignored from here (a pending one too)."""
        if _main_thread():
            for number in self.handlers:
                signal.signal(number, signal.SIG_IGN)
        self.settled = True


_running: list[Command] = []
"""The commands running in this process, the innermost last (a command run by a command)."""


@contextlib.contextmanager
def of_a_command(*, process: bool) -> Iterator[Command]:
    """For one command's run: SIGTERM unwinds as Ctrl-C does, every import is held, and
    :meth:`Command.settle` (or :func:`settled`) ignores both. After it, the handlers as they
    were; or, for a command that ran as the process and settled, still ignored to the
    process's exit. (A process an import starts inherits the held mask: none of the
    command's does.)

    A signal that arrives as they are put back is delivered after, to the caller's handler:
    Python's own raises :class:`KeyboardInterrupt` from this ``with``.
    """
    command = Command(changeable() if _main_thread() else {}, process)
    try:  # each change inside: a signal right after one still finds it undone below
        _running.append(command)
        if signal.SIGTERM in command.handlers:
            signal.signal(signal.SIGTERM, interrupt)
        with _imports_held():
            yield command
    finally:
        with held():
            with contextlib.suppress(ValueError):  # not there if a signal beat the append
                _running.remove(command)
            if not (command.process and command.settled):
                put_back(command.handlers)


def settled() -> None:
    """The running command's result is final: from here Ctrl-C and SIGTERM wait for its end.

    Called before the output that reports the result, so that a complete output always ends
    in the exit code it states. Outside a command (a program that calls a command's function
    directly) it changes nothing: the program's handlers are its own.
    """
    if _running and _main_thread():
        _running[-1].settle()


@contextlib.contextmanager
def temporary_directory(prefix: str) -> Iterator[str]:
    """A private temporary directory (mode 0o700) for the body, gone after it, however it ends.

    Its path is known before the directory exists (one ``os.mkdir``), so a Ctrl-C right after
    the ``mkdir`` still finds it named here and removed; and a Ctrl-C inside the removal lets
    the removal finish before it goes on. A hold (:func:`held`) would not do: the signal mask
    is this thread's, and a Ctrl-C the kernel hands to another thread (torch's) still runs
    Python's handler here."""
    import secrets
    import tempfile

    path: str | None = None
    try:
        while path is None:
            path = os.path.join(tempfile.gettempdir(), f"{prefix}{secrets.token_hex(8)}")
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:  # not ours: never removed here
                path = None
        yield path
    finally:
        if path is not None:
            _removed(path)


def _removed(path: str) -> None:
    """``path`` removed whole; a Ctrl-C that lands inside the removal is raised once it is done."""
    import shutil

    caught: BaseException | None = None
    while True:
        try:
            shutil.rmtree(path, ignore_errors=True)
            break
        except KeyboardInterrupt as error:
            caught = error
    if caught is not None:
        raise caught
