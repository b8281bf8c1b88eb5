"""Time the source choice on synthetic checkpoints of 1k, 10k and 100k tensors (CPU).

See ``flare_l2evict.tools.bench._synthetic`` for the checkpoint's shape. Prints
figures; asserts nothing about time.

    python benchmarks/choose_source.py
"""

from __future__ import annotations

import platform

import torch

from flare_l2evict.tools.bench import choice_times


def main() -> None:
    print(f"CPU: {platform.processor() or platform.machine()}, torch {torch.__version__}")
    print()
    print(f"{'tensors':>8}  {'median ms':>9}  {'best ms':>8}  {'map(id) ms':>10}  choice")
    for row in choice_times():
        print(
            f"{row['tensors']:>8,}  {row['median_ms']:>9.1f}  {row['best_ms']:>8.1f}  "
            f"{row['floor_ms']:>10.1f}  {row['choice']}"
        )
    print("map(id): one trivial C call per tensor on this machine, the floor of any Python pass")


if __name__ == "__main__":
    main()
