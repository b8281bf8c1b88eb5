"""Rewrite docs/command-line.md's command reference from the registry of commands.

Every command is one module of ``flare_l2evict/tools/cli/`` listed once in
``flare_l2evict.tools.cli.COMMANDS``; its usage, flags, example and exit codes here are
read off its parser and its declaration, and ``tests/test_command_registry.py`` holds the
page equal to them: after changing a command, run this and commit the page.

    python scripts/command_reference.py
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from flare_l2evict.tools.cli import COMMANDS, Command
from flare_l2evict.tools.cli._shared import PROG, parser

PAGE = Path(__file__).resolve().parents[1] / "docs" / "command-line.md"
BEGIN = "<!-- command reference: written by scripts/command_reference.py; edit the commands -->"
END = "<!-- command reference: end -->"
REGENERATE = "python scripts/command_reference.py"


def reference(commands: Sequence[Command] = COMMANDS) -> str:
    """Each command: what it does, its usage, its flags, one example and its exit codes."""
    top = parser(commands, "(version)")
    parts = []
    for command in commands:
        sub = top.commands[command.name]
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        # An indented block, not a fence: the docs' fences are all run or compared.
        parts += [f"### `{PROG} {command.name}`", _sentence(command.help), f"    {usage}"]
        parts.append("\n".join(_flag(action) for action in sub._actions if _shown(action)))
        parts.append(f"Example: `{PROG} {command.example}`. Exit codes:")
        parts.append("\n".join(f"- {code}: {meaning}" for code, meaning in command.exits.lines()))
    return "\n\n".join(parts)


def _shown(action: argparse.Action) -> bool:
    return not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS


def _flag(action: argparse.Action) -> str:
    if action.option_strings:
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        name = ", ".join(f"`{option}{metavar}`" for option in action.option_strings)
    else:
        name = f"`{action.metavar or action.dest}`"
    return f"- {name}: {_sentence(str(action.help or ''))}"


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text + ("" if text.endswith(".") else ".")


def with_reference(page: str, commands: Sequence[Command] = COMMANDS) -> str:
    """``page`` with the text between :data:`BEGIN` and :data:`END` regenerated."""
    head, begin, rest = page.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the page has no {BEGIN} ... {END} section")
    return f"{head}{BEGIN}\n\n{reference(commands)}\n\n{END}{tail}"


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    updated = with_reference(text)
    if updated != text:
        PAGE.write_text(updated, encoding="utf-8")
    print(f"{PAGE.name}: {'rewritten' if updated != text else 'already up to date'}")


if __name__ == "__main__":
    main()
