"""``flare-l2evict``: one module per command, each listed once in :data:`COMMANDS`.

A command is added with one module that declares its :class:`~._shared.Command` and one
line below; the parser, ``--help``'s examples, the dispatch and the generated command
reference (``scripts/command_line_docs.py``) all come from this list.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..._errors import L2EvictError
from ..._text import shown
from . import check, example, plan, schema, startup
from ._shared import (
    EXIT_INTERRUPTED,
    EXIT_PIPE_CLOSED,
    EXIT_USAGE,
    PROG,
    Command,
    error_line,
    fix_for,
    log_level,
    parser,
    route_log,
    signals_of_a_command,
)

__all__ = ["COMMANDS", "Command", "main"]

COMMANDS: tuple[Command, ...] = (
    startup.COMMAND,
    plan.COMMAND,
    check.COMMAND,
    example.COMMAND,
    schema.COMMAND,
)
"""Every command, in the order ``--help`` lists them."""


def own_version() -> str:
    """This package's installed version (its distribution record), torch-free."""
    from ..._b12x.provider import installed_version

    return installed_version("flare-l2evict") or "(not installed)"


def main(argv: Sequence[str] | None = None, commands: Sequence[Command] = COMMANDS) -> int:
    """Run ``flare-l2evict`` with ``argv`` (default ``sys.argv[1:]``); returns its exit code."""
    top = parser(commands, own_version())
    args, extra = top.parse_known_args(argv)
    if extra:  # argparse would blame the top-level parser; the command's --help lists its flags
        top.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    command = next(c for c in commands if c.name == args.command)
    unroute = route_log(log_level(args))
    try:
        with signals_of_a_command():
            return command.run(args)
    except L2EvictError as error:
        _error(command.name, str(error), fix_for(error))
        return EXIT_USAGE
    except BrokenPipeError:  # `| head` stopped reading: nothing to say, and nowhere to say it
        _stdout_to_devnull()
        return EXIT_PIPE_CLOSED
    except KeyboardInterrupt:
        removed = "; temporary files removed" if command.temporary(args) else ""
        _error(command.name, f"interrupted{removed}", "run the command again")
        return EXIT_INTERRUPTED
    except OSError as error:
        _error(
            command.name,
            f"{error.strerror or error} ({shown(str(error.filename or 'no file'))})",
            "check the path and its permissions",
        )
        return EXIT_USAGE
    finally:
        unroute()


def _stdout_to_devnull() -> None:
    """So that the interpreter's own flush at exit does not fail on the closed pipe again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a descriptor (a test's capture)
        pass


def _error(command: str, cause: str, fix: str | None = None) -> None:
    """The CLI's last guard: whatever an error carries, one line on stderr."""
    print(error_line(f"{PROG} {command}", cause, fix), file=sys.stderr)
