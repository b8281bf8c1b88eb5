"""How long the source choice takes for checkpoints of 1k, 10k and 100k tensors (CPU).

The choice runs once per process, at start-up, so the figure that matters is
the first call in a fresh process; :func:`first_call_times` measures that in
fresh interpreters, :func:`choice_times` the warm figure in this one.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

from ..._source import choose_source
from ._synthetic import synthetic_checkpoint

CASES: tuple[tuple[int, bool], ...] = (
    (1_000, False),
    (10_000, False),
    (100_000, False),
    (100_000, True),
)


def _window(fused: bool) -> int:
    return 4096 if fused else 1 << 21


def choice_times(repetitions: int = 7) -> list[dict[str, Any]]:
    """Median and best warm choice time per checkpoint size, beside a trivial per-tensor pass."""
    rows = []
    for count, fused in CASES:
        tensors = synthetic_checkpoint(count, fused_largest=fused)
        times = []
        for _ in range(repetitions):
            start = time.perf_counter()
            choice = choose_source(tensors, "cpu", window_bytes=_window(fused))
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


_FIRST_CALL = """
import json, sys, time
from flare_l2evict._source import choose_source
from flare_l2evict.tools.bench._synthetic import synthetic_checkpoint
count, fused, window = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
tensors = synthetic_checkpoint(count, fused_largest=fused)
times = []
for _ in range(4):
    start = time.perf_counter()
    choose_source(tensors, "cpu", window_bytes=window)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def first_call_times(processes: int = 5) -> list[dict[str, Any]]:
    """First call and the warm calls after it, each in ``processes`` fresh interpreters."""
    rows = []
    for count, fused in CASES:
        firsts: list[float] = []
        warms: list[float] = []
        for _ in range(processes):
            arguments = [str(count), str(int(fused)), str(_window(fused))]
            done = subprocess.run(
                [sys.executable, "-c", _FIRST_CALL, *arguments],
                check=True,
                capture_output=True,
                text=True,
            )
            times = json.loads(done.stdout.strip().splitlines()[-1])
            firsts.append(times[0] * 1e3)
            warms.extend(t * 1e3 for t in times[1:])
        rows.append(
            {
                "tensors": count + (0 if fused else 1),
                "largest_is_fused_views": fused,
                "first_ms": firsts,
                "first_median_ms": statistics.median(firsts),
                "warm_median_ms": statistics.median(warms),
            }
        )
    return rows
