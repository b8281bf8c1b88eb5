"""``flare-l2evict example --out DIR``: the files to try every other command on."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..._errors import L2EvictError
from ..._text import shown
from .. import _signals
from .._profiles import DEFAULT_PROFILE, PROFILES
from ._runner import EXIT_INTERRUPTED
from ._shared import (
    USAGE_ERROR,
    Command,
    Exits,
    Listed,
    Parser,
    error_line,
    wrapped,
)


def _arguments(parser: Parser, _commands: Sequence[Listed]) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory to write (made if missing)",
    )


def _run(args: argparse.Namespace) -> int:
    import sys

    from ..._credit import stock_window_bytes
    from .._example import write_example

    if args.out.exists() and not args.out.is_dir():
        raise L2EvictError(
            f"--out {shown(str(args.out))}: not a directory; fix: name a new or existing directory"
        )
    # Sized for the largest stock window of any profile (gb202's), so one example serves
    # every profile and a GPU's own L2 alike.
    window = stock_window_bytes(PROFILES[DEFAULT_PROFILE].l2_cache_bytes)
    try:
        # Settled once every file is in: an interrupt after that cannot say "nothing written".
        written = write_example(args.out, window, settle=True)
    except KeyboardInterrupt:  # write_example put DIR back as it was before it re-raised
        _signals.settled()  # decided: a second Ctrl-C cannot add a second line
        cause = f"interrupted; nothing written to {shown(str(args.out))}"
        print(error_line("flare-l2evict example", cause, "run the command again"), file=sys.stderr)
        return EXIT_INTERRUPTED
    print(
        wrapped(
            f"wrote {len(written)} files to {shown(str(args.out))} (the embedded example; "
            "checkpoints are sparse files of zeros that take no disk): "
            + ", ".join(path.name for path in written)
        )
    )
    print(f"commands to try: {shown(str(args.out / 'COMMANDS.md'))}")
    return 0


COMMAND = Command(
    name="example",
    help="write the embedded example (checkpoint three ways, configs, COMMANDS.md) to try "
    "the other commands on",
    example="example --out example",
    exits=Exits("the files were written", usage=USAGE_ERROR + "; nothing written"),
    arguments=_arguments,
    run=_run,
    verbose="log debug lines too (example has none of its own; stdout is the same)",
)
