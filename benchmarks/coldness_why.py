"""Why coldness differs between stock and the plugin, and what the hook costs: one GPU run.

    python benchmarks/coldness_why.py --out DIR [--budget SECONDS]

Each step runs in fresh processes and keeps its raw output under DIR:

1. physical coldness under Nsight Compute: HBM bytes the probe re-reads after
   each condition (stock, the plugin's Triton and torch reads, and the
   conditions that isolate one difference each: stock's kernel on the
   plugin's bytes, the Triton read on a buffer like stock's, without ``.cg``,
   in reverse; and two 1 GiB references), then the probe's L2 hit rate;
2. timed coldness of the same conditions in three fresh processes, by three
   methods: bench 0.3.0's (torch probe right after the condition), with a
   spacer kernel between condition and probe, and with a probe kernel no
   condition shares plus the spacer;
3. the eviction's cost against the HBM floor plus one launch;
4. ``before_first_capture`` in fresh processes (host with or without Triton,
   empty or warm Triton cache) and Triton's own start.

Steps are skipped, and say so, once ``--budget`` seconds have passed.
Figures only; nothing asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from flare_l2evict.tools.bench import _coldness
from flare_l2evict.tools.bench._hook_cost import (
    hook_lines,
    hook_times,
    triton_lines,
    triton_start_times,
)

ALL = ("warm", *_coldness.CLAIM, *_coldness.WHY, *_coldness.REFERENCES)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=420.0)
    parser.add_argument("--ncu-repeats", type=int, default=3)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    summary: list[str] = []
    results: dict[str, object] = {}

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:6.1f} s] {line}", file=sys.stderr, flush=True)

    def left() -> float:
        return args.budget - (time.monotonic() - began)

    def step(name: str, need: float) -> bool:
        if left() < need:
            summary.append(f"SKIPPED {name}: {left():.0f} s of the budget left, needs ~{need:.0f}")
            log(summary[-1])
            return False
        log(f"start {name}")
        return True

    ncu: list[dict[str, object]] = []
    if step("ncu dram bytes, process 1", 60):
        ncu += _coldness.ncu_in_processes(
            out, [("dram__bytes_read.sum", 1)], why=True, repeats=args.ncu_repeats, log=log
        )
    if step("timed coldness, 3 fresh processes, 3 methods", 90):
        runs = _coldness.timed_in_processes(
            out, 3, methods=list(_coldness.METHODS), why=True, repeats=2, log=log
        )
        results["timed"] = runs
        for method in _coldness.METHODS:
            summary.append(f"-- timed, method {method} (coldness: 0 warm, 1 = after cold_1gib)")
            summary += _coldness.timed_lines(runs, method, names=ALL[1:])
    if step("cost against floor + one launch", 20):
        from flare_l2evict.tools.bench._run import _cost

        device = torch.device("cuda", 0)
        l2 = int(torch.cuda.get_device_properties(device).L2_cache_size)
        from flare_l2evict._window import stock_window_bytes

        weights = torch.ones(max(8 * l2, 512 << 20) // 4, device=device)
        cost = _cost(device, weights, stock_window_bytes(l2), 3)
        results["cost"] = cost
        us = cost["us"]
        summary.append("-- cost per eviction (us), median [min-max] of 3 repeats")
        summary += [
            f"{name}: {v['median']:.1f} [{v['min']:.1f}-{v['max']:.1f}]" for name, v in us.items()
        ]
        for name, figure in cost["over_floor_plus_launch"].items():
            summary.append(
                f"{name} vs floor + one launch: limit {figure['limit_us']['median']:.1f} us, "
                f"excess {figure['excess_us']['median']:+.1f} us, under in every repeat: "
                f"{figure['under']}"
            )
        del weights
        torch.cuda.empty_cache()
    if step("hook cost, 4 modes x 3 fresh processes", 75):
        rows = hook_times("cuda:0", samples=3, log=log)
        results["hook"] = rows
        summary.append("-- before_first_capture, fresh processes")
        summary += hook_lines(rows)
    if step("Triton start, fresh processes", 30):
        rows = triton_start_times(samples=3, log=log)
        results["triton_start"] = rows
        summary += triton_lines(rows)
    for index in (2, 3):
        if step(f"ncu dram bytes, process {index}", 60):
            ncu += _coldness.ncu_in_processes(
                out,
                [("dram__bytes_read.sum", 1)],
                why=True,
                repeats=args.ncu_repeats,
                log=log,
                first=index,
            )
    if step("ncu L2 hit rate, process 1", 60):
        ncu += _coldness.ncu_in_processes(
            out, [("lts__t_sector_hit_rate.pct", 1)], why=True, repeats=2, log=log
        )
    results["ncu"] = ncu
    summary.append("-- Nsight Compute, probe kernel flare_probe after each condition")
    summary += _coldness.ncu_lines(ncu, names=ALL[1:])
    (out / "coldness-why.json").write_text(json.dumps(results, indent=1, default=str))
    text = "\n".join(summary)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
