"""``flare-l2evict schema COMMAND``: the JSON Schema of what ``COMMAND --json`` prints."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from pydantic import BaseModel

from ._shared import Command, Exits, Parser, settled


def _arguments(parser: Parser, commands: Sequence[Command]) -> None:
    outputs = {command.name: command.output for command in commands if command.output}
    parser.add_argument(
        "name",
        choices=list(outputs),
        metavar="|".join(outputs),
        help="the command whose --json output to describe",
    )
    parser.set_defaults(outputs=outputs)


def _run(args: argparse.Namespace) -> int:
    from .._json_output import json_schema

    model: type[BaseModel] = args.outputs[args.name]
    text = json.dumps(json_schema(model), indent=2)
    settled()
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
