"""Every ``--json`` object a test reads, checked against the schema its command prints.

:func:`parsed` is how the CLI tests read ``startup``, ``plan`` and ``check``
JSON: it parses the text and validates it against ``flare-l2evict schema
COMMAND``'s schema (``tests/test_json_output.py`` holds the command to print
exactly :func:`schema_of` the command, its model's JSON Schema).

:func:`validate` is a JSON Schema validator for the keywords pydantic writes
(no ``jsonschema`` in the test environment). It refuses a keyword it does not
know rather than skip it, so a schema it cannot check fails loudly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flare_l2evict.tools._json_output import json_schema
from flare_l2evict.tools.cli import COMMANDS

_ANNOTATIONS = frozenset(
    {"$schema", "$defs", "title", "description", "default", "examples", "readOnly"}
)
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def schema_of(command: str) -> dict[str, Any]:
    """The JSON Schema of what ``command --json`` prints: its registered model's."""
    (output,) = [c.load().output for c in COMMANDS if c.name == command and c.json]
    assert output is not None
    return json_schema(output())


def parsed(command: str, text: str) -> dict[str, Any]:
    """``command --json``'s stdout as a dict, after validating it against its schema."""
    data = json.loads(text)
    validate(data, schema_of(command))
    assert isinstance(data, dict)
    return data


def validate(instance: object, schema: Mapping[str, Any]) -> None:
    """Raise ``AssertionError`` naming the path where ``instance`` breaks ``schema``."""
    _check(instance, schema, schema, "$")


def _is(instance: object, kind: str) -> bool:
    if isinstance(instance, bool) and kind in ("integer", "number"):
        return False  # JSON's true is no number, though Python's bool is an int
    if kind == "integer" and isinstance(instance, float):
        return instance.is_integer()
    return isinstance(instance, _TYPES[kind])


def _same(instance: object, value: object) -> bool:
    """JSON equality: true is not 1, as Python's ``==`` would have it."""
    return instance == value and isinstance(instance, bool) == isinstance(value, bool)


def _check(instance: object, node: Mapping[str, Any], root: Mapping[str, Any], path: str) -> None:
    unknown = set(node) - _ANNOTATIONS - _KEYWORDS
    assert not unknown, f"{path}: the validator does not know {sorted(unknown)}"
    if "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), f"{path}: $ref {ref}"
        _check(instance, root["$defs"][ref.removeprefix("#/$defs/")], root, path)
    if "anyOf" in node:
        failures = []
        for option in node["anyOf"]:
            try:
                _check(instance, option, root, path)
                break
            except AssertionError as failure:
                failures.append(str(failure))
        else:
            raise AssertionError(f"{path}: matches none of anyOf: {failures}")
    if "type" in node:
        assert _is(instance, node["type"]), f"{path}: {instance!r} is not {node['type']}"
    if "const" in node:
        assert _same(instance, node["const"]), f"{path}: {instance!r} is not {node['const']!r}"
    if "enum" in node:
        found = any(_same(instance, value) for value in node["enum"])
        assert found, f"{path}: {instance!r} is not in {node['enum']}"
    if "minimum" in node and isinstance(instance, (int, float)):
        assert instance >= node["minimum"], f"{path}: {instance} < {node['minimum']}"
    if "maximum" in node and isinstance(instance, (int, float)):
        assert instance <= node["maximum"], f"{path}: {instance} > {node['maximum']}"
    if isinstance(instance, list):
        for bound, ok in (("minItems", len(instance).__ge__), ("maxItems", len(instance).__le__)):
            if bound in node:
                assert ok(node[bound]), f"{path}: {len(instance)} items, {bound} {node[bound]}"
        prefix = node.get("prefixItems", [])
        for index, item in enumerate(instance):
            if index < len(prefix):
                _check(item, prefix[index], root, f"{path}[{index}]")
            elif "items" in node:
                _check(item, node["items"], root, f"{path}[{index}]")
    if isinstance(instance, dict):
        properties = node.get("properties", {})
        for key in node.get("required", ()):
            assert key in instance, f"{path}: required key {key!r} is missing"
        for key, value in instance.items():
            if key in properties:
                _check(value, properties[key], root, f"{path}.{key}")
            elif node.get("additionalProperties") is False:
                raise AssertionError(f"{path}: key {key!r} is not in the schema")
            elif isinstance(node.get("additionalProperties"), Mapping):
                _check(value, node["additionalProperties"], root, f"{path}.{key}")


_KEYWORDS = frozenset(
    {
        "$ref",
        "anyOf",
        "type",
        "const",
        "enum",
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "prefixItems",
        "items",
        "properties",
        "required",
        "additionalProperties",
    }
)
"""The keywords :func:`validate` checks."""
