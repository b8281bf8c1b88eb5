"""Rewrite the generated sections of docs/command-line.md from the registry of commands.

Every command is one module of ``flare_l2evict/tools/cli/`` named once in
``flare_l2evict.tools.cli.COMMANDS``, which loads each here. Two sections of the page come
from it: the command reference (each command's usage, flags, example and exit codes, read
off its parser and its declaration) and the JSON field tables (each command's ``output``
model, through :func:`flare_l2evict.tools._json_output.json_schema`).
``tests/test_command_registry.py`` holds the page equal to them: after changing a command
or a model, run this and commit the page.

    python scripts/command_line_docs.py
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from flare_l2evict.tools._json_output import json_schema
from flare_l2evict.tools.cli import COMMANDS
from flare_l2evict.tools.cli._shared import PROG, Listed, parser

PAGE = Path(__file__).resolve().parents[1] / "docs" / "command-line.md"
REGENERATE = "python scripts/command_line_docs.py"
"""The command that rewrites the page's generated sections."""


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    updated = regenerated(text)
    if updated != text:
        PAGE.write_text(updated, encoding="utf-8")
    print(f"{PAGE.name}: {'rewritten' if updated != text else 'already up to date'}")


def regenerated(page: str, commands: Sequence[Listed] = COMMANDS) -> str:
    """``page`` with each generated section (between its two markers) written anew."""
    sections: dict[str, tuple[str, Callable[[Sequence[Listed]], str]]] = {
        "command reference": ("edit the commands", reference),
        "json fields": ("edit the models instead", field_tables),
    }
    for name, (hint, write) in sections.items():
        begin = f"<!-- {name}: written by scripts/command_line_docs.py; {hint} -->"
        end = f"<!-- {name}: end -->"
        head, found_begin, rest = page.partition(begin)
        _, found_end, tail = rest.partition(end)
        if not found_begin or not found_end:
            raise ValueError(f"the page has no {begin} ... {end} section")
        page = f"{head}{begin}\n\n{write(commands)}\n\n{end}{tail}"
    return page


def reference(commands: Sequence[Listed] = COMMANDS) -> str:
    """Each command: what it does, its usage, its flags, one example and its exit codes."""
    top = parser(commands, "(version)")
    parts = []
    for command in (entry.load() for entry in commands):
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


def field_tables(commands: Sequence[Listed] = COMMANDS) -> str:
    """The field tables of every command's JSON, as ``docs/command-line.md`` shows them."""
    parts = []
    for command in (entry.load() for entry in commands):
        if command.output is None:
            continue
        schema = json_schema(command.output())
        about = _about(schema).partition("`: ")[2]
        parts += [f"### `flare-l2evict {command.name} --json`", about[:1].upper() + about[1:]]
        parts += _tables(schema)
    return "\n\n".join(parts)


def _about(node: Mapping[str, Any]) -> str:
    """A description's first paragraph, on one line, in Markdown's quotes."""
    text = str(node.get("description", "")).partition("\n\n")[0]
    return _cell(text)


def _tables(schema: Mapping[str, Any]) -> list[str]:
    """One table per object: the command's, then each model it holds, in order of first use."""
    defs: Mapping[str, Any] = schema.get("$defs", {})
    order: list[tuple[str, list[str]]] = [("", [""])]  # (def name, the paths that hold it)
    tables = []
    index = 0
    while index < len(order):
        name, paths = order[index]
        index += 1
        node = defs[name] if name else schema
        rows = ["| key | type | meaning |", "|---|---|---|"]
        for key, prop in node["properties"].items():
            about = _about(prop) or next((_about(defs[ref]) for ref, _ in _refs(prop)), "")
            if not about:
                raise ValueError(
                    f"{name or 'the top'}.{key} has no description: give its Field one (or, "
                    "for the plugin's report and audit, an entry in _DESCRIPTIONS)"
                )
            rows.append(f"| `{key}` | {_type(prop)} | {about} |")
            for ref, suffix in _refs(prop):
                held = [f"{p}.{key}{suffix}" if p else f"{key}{suffix}" for p in paths]
                known = next((entry for entry in order if entry[0] == ref), None)
                if known is None:
                    order.append((ref, held))
                else:
                    known[1].extend(p for p in held if p not in known[1])
        if name:
            where = ", ".join(f"`{p}`" for p in paths)
            tables.append(f"{where}: {_about(node)}\n\n" + "\n".join(rows))
        else:
            tables.append("\n".join(rows))
    return tables


def _refs(prop: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The models ``prop`` holds, each with the suffix of its path (``[]`` for an array's)."""
    if "$ref" in prop:
        yield prop["$ref"].rpartition("/")[2], ""
    for option in prop.get("anyOf", ()):
        yield from _refs(option)
    if "items" in prop:
        for ref, suffix in _refs(prop["items"]):
            yield ref, "[]" + suffix


def _type(prop: Mapping[str, Any]) -> str:
    """``prop``'s JSON type in words."""
    if "$ref" in prop:
        return f"object `{prop['$ref'].rpartition('/')[2]}`"
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " or ".join(f"`{json.dumps(value)}`" for value in prop["enum"])
    if "anyOf" in prop:
        return " or ".join(_type(option) for option in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"array of {_type(prop.get('items', {}))}"
    if kind == "object" and "additionalProperties" in prop:
        return f"object of {_type(prop['additionalProperties'])}"
    if kind == "integer" and "minimum" in prop:
        return f"integer >= {prop['minimum']}"
    return str(kind)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


if __name__ == "__main__":
    main()
