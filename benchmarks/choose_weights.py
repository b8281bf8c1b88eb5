"""Time the source choice on synthetic checkpoints of 1k, 10k and 100k tensors (CPU).

The choice runs once per process at start-up: the first column is the first
call in a fresh interpreter (median of 5 processes, and their range), the
second the warm calls after it. See ``benchmarks.bench._synthetic``
for the checkpoint's shape. Prints figures; asserts nothing about time.

``--hostile`` times what a hostile host can hand the choice instead (issue 21):
1,000,000 tiny torch storages whose names sort opposite to their addresses,
200,000 overlapping slices of one range, the plugin's maximum of 4,000,000
storages in reverse order (torch-free, as ``plan`` passes them), and the
eviction's per-read check that its pieces are still in place.

    python -m benchmarks.choose_weights [--hostile]
"""

from __future__ import annotations

import os
import platform
import sys
import time

import torch

from benchmarks.bench import first_call_times


def main() -> None:
    print(
        f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )
    print()
    print(f"{'tensors':>8}  {'first call ms (range)':>22}  {'warm ms':>8}  largest storage")
    for row in first_call_times():
        first = row["first_ms"]
        shown = f"{row['first_median_ms']:.1f} ({min(first):.1f}-{max(first):.1f})"
        kind = "66 equal fused blocks" if row["largest_is_fused_views"] else "one block"
        print(f"{row['tensors']:>8,}  {shown:>22}  {row['warm_median_ms']:>8.1f}  {kind}")


def hostile() -> None:
    from flare_l2evict._decision import Storages, choose_regions
    from flare_l2evict._errors import WeightsError
    from flare_l2evict._eviction import WeightEviction
    from flare_l2evict.tools._choose_weights import choose_weights

    count = 1_000_000
    tensors = {f"t{count - i:08d}": torch.zeros(32) for i in range(count)}  # 128 B each
    started = time.perf_counter()
    try:  # a quarter of their bytes: 262,144 of them, so refused past 64 pieces
        choose_weights(tensors, "cpu", 32 << 20)
        outcome = "chosen"
    except WeightsError:
        outcome = "refused"
    took = time.perf_counter() - started
    print(f"{count:>9,} tiny torch storages, names opposite to addresses: {took:.2f} s ({outcome})")
    tensors.clear()
    for n, kind in ((200_000, "overlapping"), (4_000_000, "reversed")):
        if kind == "overlapping":
            names = [f"s{i:08d}" for i in range(n)]
            sizes, starts = [1 << 20] * n, [i * 64 for i in range(n)]
        else:
            names = [f"t{n - i:08d}" for i in range(n)]
            sizes, starts = [128] * n, [i * 128 for i in range(n)]
        started = time.perf_counter()
        choice = choose_regions(Storages(names, sizes, starts), n * 64)
        took = time.perf_counter() - started
        outcome = "chosen" if choice.shortfall is None else "refused"
        print(f"{n:>9,} {kind} storages (torch-free decision): {took:.2f} s ({outcome})")
    weights = {f"w{i}": torch.zeros(1 << 18) for i in range(3)}
    eviction = WeightEviction(choose_weights(weights, "cpu", 3 << 20))
    calls = 200_000
    started = time.perf_counter()
    for _ in range(calls):
        eviction._broken()
    took = time.perf_counter() - started
    print(f"per-read check, 3 pieces: {took / calls * 1e6:.2f} us a call ({calls:,} calls)")


if __name__ == "__main__":
    hostile() if "--hostile" in sys.argv[1:] else main()
