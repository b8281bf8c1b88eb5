"""``flare-l2evict``: one module per command, each named once in :data:`COMMANDS`.

A command is added with one module that declares its :class:`~._shared.Command` and one
entry below: its name, its module and its summary. The parser, ``--help``'s examples, the
dispatch and the generated command reference (``scripts/command_line_docs.py``) all come
from this list. Only the module of the command that runs is imported, as pip's
``commands/__init__.py`` does with its ``CommandInfo``: ``--help``, ``--version`` and a
usage error import neither torch nor pydantic, and answer at once.

This module imports little, so that :func:`main`, the console script's entry, takes Ctrl-C
into its hands within milliseconds of the interpreter's start.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._runner import Job, run

if TYPE_CHECKING:
    from ._shared import Command, Listed

__all__ = ["COMMANDS", "Command", "CommandInfo", "main"]


class CommandInfo:
    """One entry of the registry: a command's name, its module and its summary (``--help``'s).

    ``json`` says whether it prints ``--json`` (``schema``'s choices); :meth:`load` imports the
    module and gives its declaration, which a test holds equal to this entry.
    """

    __slots__ = ("help", "json", "module", "name")

    def __init__(self, name: str, module: str, help: str, *, json: bool = False) -> None:
        self.name = name
        self.module = module
        self.help = help
        self.json = json

    def load(self) -> Command:
        command: Command = importlib.import_module(self.module, __name__).COMMAND
        return command

    def __repr__(self) -> str:
        return f"CommandInfo({self.name!r}, {self.module!r})"


COMMANDS: tuple[CommandInfo, ...] = (
    CommandInfo(
        "startup",
        ".startup",
        "run the reference host without and with plugins and compare the KV cache",
        json=True,
    ),
    CommandInfo(
        "plan",
        ".plan",
        "read safetensors headers only and show, per rank, what the plugin would reclaim",
        json=True,
    ),
    CommandInfo(
        "check",
        ".check",
        "preflight on the serving machine: would the plugin install, and what would it "
        "credit (exit 0 installs, or installs only if the condition it names holds, without "
        "a checkpoint; 1 falls back; 2 bad input)",
        json=True,
    ),
    CommandInfo(
        "example",
        ".example",
        "write the embedded example (checkpoint three ways, configs, COMMANDS.md) to try "
        "the other commands on",
    ),
    CommandInfo(
        "schema",
        ".schema",
        "print the JSON Schema of what startup, plan or check prints with --json",
    ),
)
"""Every command, in the order ``--help`` lists them."""


def main(argv: Sequence[str] | None = None, commands: Sequence[Listed] = COMMANDS) -> int:
    """Run ``flare-l2evict`` with ``argv``; returns its exit code.

    Without ``argv`` it is the process's command (the console script's, ``python -m
    flare_l2evict``'s): it reads ``sys.argv[1:]``, and once its result is settled Ctrl-C and
    SIGTERM stay ignored to the process's exit. With ``argv`` it is a call: the caller's
    handlers are put back as it returns.
    """
    return run("flare-l2evict", lambda: _prepared(argv, commands), process=argv is None)


def _prepared(argv: Sequence[str] | None, commands: Sequence[Listed]) -> Job:
    """The parser of the named command only (its module imported), the arguments read and
    the log routed: the job the runner runs."""
    from ._shared import PROG, log_level, own_version, parser, route_log

    listed = argv if argv is not None else sys.argv[1:]
    named = _named(listed, [c.name for c in commands])
    top = parser(commands, own_version, load=[named] if named else [])
    args, extra = top.parse_known_args(argv)
    if extra:  # argparse would blame the top-level parser; the command's --help lists its flags
        top.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    command = next(c for c in commands if c.name == args.command).load()

    def logged() -> int:
        unroute = route_log(log_level(args))
        try:
            return command.run(args)
        finally:
            unroute()

    return Job(f"{PROG} {command.name}", logged, temporary=command.temporary(args))


def _named(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The command ``argv`` names, as argparse will read it: its first word that is not an
    option (no top-level option takes a value)."""
    word = next((word for word in argv if not word.startswith("-")), None)
    return word if word in names else None


def __getattr__(name: str) -> Any:
    if name == "Command":  # its module is the parser's: loaded only where one is needed
        from ._shared import Command

        return Command
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
