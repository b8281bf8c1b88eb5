"""How a command runs, the CLI's and the bench's: every end is one line or its own output.

An error is one line on stderr and exit 2; Ctrl-C or SIGTERM, one line and exit 130; a
reader that stopped reading, no line and exit 141. Once the result is decided (a command's
settled output, or one of those lines) it stands: Ctrl-C and SIGTERM are ignored while it
is said, and one that comes as the handlers are put back ends with the decided code. The
signal rules are :mod:`flare_l2evict.tools._signals`'.

It imports little: the console script reaches it before any command's module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Final

from ..._errors import L2EvictError
from .. import _signals

EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_PIPE_CLOSED: Final = 141  # 128 + SIGPIPE, as a shell reports a command whose reader left


class Job:
    """What the runner runs, once the arguments are read: who speaks in its error lines, the
    work (returning its exit code), and whether an interrupted run removed temporary files."""

    __slots__ = ("run", "said", "temporary")

    def __init__(self, said: str, run: Callable[[], int], *, temporary: bool = False) -> None:
        self.said = said
        self.run = run
        self.temporary = temporary


def run(prog: str, prepare: Callable[[], Job], *, process: bool) -> int:
    """Read the arguments (``prepare``), then run the job; returns its exit code.

    ``prepare`` runs with Ctrl-C and SIGTERM held (it is quick), so ``--help`` and a usage
    error, which it prints and ends with :class:`SystemExit`, print whole; that exit is
    raised again. ``process``: the run is the process's, and once decided Ctrl-C and SIGTERM
    stay ignored to its exit (see :func:`._signals.of_a_command`).
    """
    said, temporary = prog, False
    decided: int | None = None
    exiting: SystemExit | None = None
    try:
        with _signals.of_a_command(process=process) as command:
            try:
                with _signals.held():
                    try:
                        job = prepare()
                    except SystemExit as ended:  # printed whole, under the hold: it stands
                        command.settle()
                        exiting = ended
                        raise
                said, temporary = job.said, job.temporary
                decided = job.run()
            except KeyboardInterrupt:
                removed = "; temporary files removed" if temporary else ""
                cause = f"interrupted{removed}"
                decided = _say(command, said, cause, "run the command again", EXIT_INTERRUPTED)
            except L2EvictError as error:
                from ._shared import fix_for

                decided = _say(command, said, str(error), fix_for(error), EXIT_USAGE)
            except BrokenPipeError:  # `| head` stopped reading: nothing to say, nowhere to say it
                command.settle()
                _stdout_to_devnull()
                decided = EXIT_PIPE_CLOSED
            except OSError as error:
                where = error.filename or "no file"
                decided = _say(
                    command,
                    said,
                    f"{error.strerror or error} ({_shown(str(where))})",
                    "check the path and its permissions",
                    EXIT_USAGE,
                )
    except KeyboardInterrupt:  # as the handlers were put back (a caller's own): the end stands
        if exiting is not None:
            raise exiting from None
        if decided is None:  # before the command had begun
            decided = _say(None, said, "interrupted", "run the command again", EXIT_INTERRUPTED)
    assert decided is not None  # every way out of the ``with`` above decides or raises
    return decided


def _say(
    command: _signals.Command | None, said: str, cause: str, fix: str | None, code: int
) -> int:
    """The decided end's one line on stderr, said with Ctrl-C and SIGTERM ignored."""
    if command is not None:
        command.settle()
    from ._shared import error_line

    print(error_line(said, cause, fix), file=sys.stderr)
    return code


def _shown(text: str) -> str:
    from ..._text import shown

    return shown(text)


def _stdout_to_devnull() -> None:
    """So that the interpreter's own flush at exit does not fail on the closed pipe again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a descriptor (a test's capture)
        pass
