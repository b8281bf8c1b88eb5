"""``python -m benchmarks.bench``: the GPU bench's command line, run from a checkout.

The options and the output are those of the bench when it was ``flare-l2evict
bench``; only the command's name changed (the wheel no longer holds the bench).
Errors keep the CLI's shape: one line, ``error: python -m benchmarks.bench:
<cause>; fix: <fix>``, exit 2; ``--help`` is argparse's own.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flare_l2evict._errors import L2EvictError
from flare_l2evict.tools.cli._runner import Job, run
from flare_l2evict.tools.cli._shared import (
    Parser,
    device_text,
    missing_driver,
    whole_number_in,
)

PROG = "python -m benchmarks.bench"
SECTIONS = ("memory", "cost", "coldness", "races", "hook")
"""``--only``'s sections (BENCHMARKS.md numbers them 1, 3, 2 and 5, 4 and 7, 6)."""
LIMITS = {"--repetitions": 100_000, "--races": 36, "--repeats": 20}
"""Upper bounds that refuse a typo before it costs hours of device time."""


def _bounded(flag: str) -> Any:
    return whole_number_in(1, LIMITS[flag])


def parser() -> argparse.ArgumentParser:
    """The bench's parser (torch-free: ``--help`` and usage errors import no torch)."""
    bench = Parser(
        prog=PROG,
        description="on a GPU: stock b12x eviction vs the plugin's (memory, efficacy, cost, races)",
    )
    bench.add_argument("--device", type=device_text, metavar="cuda:N", help="(default cuda:0)")
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench-out"),
        metavar="DIR",
        help="where bench.json and efficacy.png go (default bench-out)",
    )
    bench.add_argument(
        "--repetitions",
        type=_bounded("--repetitions"),
        default=240,
        metavar="R",
        help="probe samples per point and repeat",
    )
    bench.add_argument(
        "--races", type=_bounded("--races"), default=36, metavar="N", help="races (at most 36)"
    )
    bench.add_argument(
        "--repeats",
        type=_bounded("--repeats"),
        default=3,
        metavar="K",
        help="interleaved repeats of each figure (the spread is their range)",
    )
    bench.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help=f"run only this section (repeatable; one of {', '.join(SECTIONS)}; default: all)",
    )
    bench.add_argument("--json", action="store_true", help="print the full JSON instead of a table")
    return bench


def _bench(args: argparse.Namespace) -> int:
    given = args.device is not None
    args.device = args.device or "cuda:0"
    # A machine with no GPU driver is told in milliseconds; torch's import takes seconds.
    usable = args.device.startswith("cuda") and missing_driver() is None
    if usable:
        import torch

        usable = torch.cuda.is_available()
    if not usable:
        if not given:
            why = "no --device given, and the default cuda:0 is not available: no CUDA here"
        elif args.device.startswith("cuda"):
            why = f"--device {args.device} given, but CUDA is not available here"
        else:
            why = f"--device {args.device} given"
        raise L2EvictError(f"needs a CUDA device ({why}); fix: run it on a GPU machine")
    import torch

    device = torch.device(args.device)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise L2EvictError(
            f"--device {args.device}: this machine has {torch.cuda.device_count()} CUDA "
            f"devices; fix: --device cuda:0..{torch.cuda.device_count() - 1}"
        )
    from ._run import run_bench, summary_table

    result = run_bench(
        device,
        args.out,
        repetitions=args.repetitions,
        races=args.races,
        repeats=args.repeats,
        sections=frozenset(args.only or SECTIONS),
        log=lambda line: print(line, file=sys.stderr),
    )
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        plot = result["plot"] or (
            "no matplotlib" if "coldness" in result else "none (no coldness section)"
        )
        print(f"full figures: {args.out / 'bench.json'}; plot: {plot}")
        print(summary_table(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench with ``argv`` (default ``sys.argv[1:]``); returns its exit code.

    It runs on the CLI's runner: the same lines, exit codes and signal rules as
    ``flare-l2evict`` (an interruption removes the bench's temporary files on the way out).
    """
    return run(PROG, lambda: _prepared(argv), process=argv is None)


def _prepared(argv: Sequence[str] | None) -> Job:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    return Job(PROG, lambda: _bench(args), temporary=True)
