"""How long the source choice takes for checkpoints of 1k, 10k and 100k tensors (CPU)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..._source import choose_source
from ._synthetic import synthetic_checkpoint


def choice_times(repetitions: int = 7) -> list[dict[str, Any]]:
    """Median and best choice time per checkpoint size, beside a trivial per-tensor pass."""
    rows = []
    cases = [(n, False) for n in (1_000, 10_000, 100_000)] + [(100_000, True)]
    for count, fused in cases:
        tensors = synthetic_checkpoint(count, fused_largest=fused)
        window = 4096 if fused else 1 << 21
        times = []
        for _ in range(repetitions):
            start = time.perf_counter()
            choice = choose_source(tensors, "cpu", window_bytes=window)
            times.append(time.perf_counter() - start)
        values = list(tensors.values())
        start = time.perf_counter()
        list(map(id, values))
        floor = time.perf_counter() - start
        rows.append(
            {
                "tensors": len(tensors),
                "largest_is_fused_views": fused,
                "median_ms": statistics.median(times) * 1e3,
                "best_ms": min(times) * 1e3,
                "floor_ms": floor * 1e3,
                "choice": choice.name + (" (largest = 66 equal fused blocks)" if fused else ""),
            }
        )
    return rows
