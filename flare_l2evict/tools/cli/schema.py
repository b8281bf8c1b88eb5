"""``flare-l2evict schema COMMAND``: the JSON Schema of what ``COMMAND --json`` prints."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import _signals
from ._shared import Command, Exits, Listed, Parser

if TYPE_CHECKING:
    from pydantic import BaseModel


def _arguments(parser: Parser, commands: Sequence[Listed]) -> None:
    # The registry's entries, not the commands: only the one described is imported.
    outputs = {command.name: command for command in commands if command.json}
    parser.add_argument(
        "name",
        choices=list(outputs),
        metavar="|".join(outputs),
        help="the command whose --json output to describe",
    )
    parser.set_defaults(outputs=outputs)


def _run(args: argparse.Namespace) -> int:
    from .._json_output import json_schema

    output = args.outputs[args.name].load().output
    assert output is not None  # the registry's json and the command's output agree (a test)
    model: type[BaseModel] = output()
    text = json.dumps(json_schema(model), indent=2)
    _signals.settled()
    print(text)
    return 0


COMMAND = Command(
    name="schema",
    help="print the JSON Schema of what startup, plan or check prints with --json",
    example="schema check",
    exits=Exits("the schema was printed (JSON, on stdout)"),
    arguments=_arguments,
    run=_run,
    verbose="log debug lines too (schema has none; stdout is the same)",
)
