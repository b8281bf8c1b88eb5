"""Issue 17's GPU evidence apart from the full bench: hook cost, Triton's start, coldness runs.

    python -m benchmarks.evidence --out DIR [--hook] [--coldness N] [--ncu N]

* ``--hook``: ``before_first_capture`` in 3 fresh processes for each of: host
  with / without a Triton kernel already run, Triton cache empty / warm; then
  Triton's own start (``import triton``, ``triton_key()``, first launch) in 3
  fresh processes per cache state.
* ``--coldness N``: N more fresh processes of timed coldness (stock, the
  plugin's Triton and torch reads, and the conditions that isolate why), by the
  bench's method (a spacer kernel before the probe) and by bench 0.3.0's.
* ``--ncu N``: N fresh processes of the probe's HBM bytes under Nsight Compute.

Every raw figure is kept under DIR; the table is printed last. Figures only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.bench import _coldness
from benchmarks.bench._hook_cost import (
    hook_lines,
    hook_times,
    triton_lines,
    triton_start_times,
)
from flare_l2evict.tools.cli._shared import Parser

NAMES = (*_coldness.CLAIM, *_coldness.WHY, *_coldness.REFERENCES)


def main() -> int:
    parser = Parser(prog="python -m benchmarks.evidence")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hook", action="store_true")
    parser.add_argument("--coldness", type=int, default=0)
    parser.add_argument("--ncu", type=int, default=0)
    parser.add_argument("--first", type=int, default=1, help="number of the first process")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    lines: list[str] = []
    results: dict[str, object] = {}
    if args.hook:
        hook = hook_times("cuda:0", samples=3, log=log)
        start = triton_start_times(samples=3, log=log)
        results.update(hook=hook, triton_start=start)
        lines += ["-- before_first_capture in fresh processes, ms: median [min-max]"]
        lines += hook_lines(hook)
        lines += triton_lines(start)
    if args.coldness:
        runs = _coldness.timed_in_processes(
            args.out / "timed", args.coldness, methods=("spacer", "plain"), why=True, log=log
        )
        results["timed"] = runs
        for method in ("spacer", "plain"):
            lines.append(f"-- timed coldness, method {method} (0 warm, 1 = after cold_1gib)")
            lines += _coldness.timed_lines(runs, method, NAMES)
    if args.ncu:
        counted = _coldness.ncu_in_processes(
            args.out,
            [("dram__bytes_read.sum", args.ncu)],
            why=True,
            repeats=3,
            log=log,
            first=args.first,
        )
        results["ncu"] = counted
        lines += ["-- Nsight Compute: HBM bytes the probe re-reads / its size"]
        lines += _coldness.ncu_lines(counted, NAMES)
    (args.out / "evidence.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
