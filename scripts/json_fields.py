"""Rewrite docs/command-line.md's JSON field tables from the models they describe.

Each command's ``--json`` output is one pydantic model, declared by the command
(``flare_l2evict.tools.cli.COMMANDS``: each command's ``output``); its tables are
generated from :func:`flare_l2evict.tools._json_output.json_schema` of that model, and
``tests/test_json_output.py`` holds the page equal to them: after changing a model, run
this and commit the page.

    python scripts/json_fields.py
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from flare_l2evict.tools._json_output import json_schema
from flare_l2evict.tools.cli import COMMANDS, Command

PAGE = Path(__file__).resolve().parents[1] / "docs" / "command-line.md"


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    updated = with_field_tables(text)
    if updated != text:
        PAGE.write_text(updated, encoding="utf-8")
    print(f"{PAGE.name}: {'rewritten' if updated != text else 'already up to date'}")


FIELDS_BEGIN = "<!-- json fields: written by scripts/json_fields.py; edit the models instead -->"
FIELDS_END = "<!-- json fields: end -->"
REGENERATE = "python scripts/json_fields.py"
"""The command that rewrites ``docs/command-line.md``'s field tables from the models."""


def with_field_tables(page: str, commands: Sequence[Command] = COMMANDS) -> str:
    """``page`` with the text between :data:`FIELDS_BEGIN` and :data:`FIELDS_END` regenerated."""
    head, begin, rest = page.partition(FIELDS_BEGIN)
    _, end, tail = rest.partition(FIELDS_END)
    if not begin or not end:
        raise ValueError(f"the page has no {FIELDS_BEGIN} ... {FIELDS_END} section")
    return f"{head}{FIELDS_BEGIN}\n\n{field_tables(commands)}\n\n{FIELDS_END}{tail}"


def field_tables(commands: Sequence[Command] = COMMANDS) -> str:
    """The field tables of every command's JSON, as ``docs/command-line.md`` shows them."""
    parts = []
    for command in commands:
        if command.output is None:
            continue
        schema = json_schema(command.output)
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
