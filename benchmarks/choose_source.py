"""Time the source choice on synthetic checkpoints of 1k, 10k and 100k tensors (CPU).

The choice runs once per process at start-up: the first column is the first
call in a fresh interpreter (median of 5 processes, and their range), the
second the warm calls after it. See ``flare_l2evict.tools.bench._synthetic``
for the checkpoint's shape. Prints figures; asserts nothing about time.

    python benchmarks/choose_source.py
"""

from __future__ import annotations

import os
import platform

import torch

from flare_l2evict.tools.bench import first_call_times


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


if __name__ == "__main__":
    main()
