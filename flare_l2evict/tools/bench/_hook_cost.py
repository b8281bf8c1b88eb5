"""How long the source choice takes for checkpoints of 1k, 10k and 100k tensors (CPU).

The choice runs once per process, at start-up, so the figure that matters is
the first call in a fresh process: :func:`first_call_times` measures it in
fresh interpreters, with the warm calls after it for comparison.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

CASES: tuple[tuple[int, bool], ...] = (
    (1_000, False),
    (10_000, False),
    (100_000, False),
    (100_000, True),
)


def _window(fused: bool) -> int:
    return 4096 if fused else 1 << 21


_FIRST_CALL = """
import json, sys, time
from flare_l2evict import choose_source
from flare_l2evict.tools.bench import synthetic_checkpoint
count, fused, window = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
tensors = synthetic_checkpoint(count, fused_largest=fused)
times = []
for _ in range(4):
    start = time.perf_counter()
    choose_source(tensors, "cpu", window_bytes=window)
    times.append(time.perf_counter() - start)
print(json.dumps({"tensors": len(tensors), "times": times}))
"""


def first_call_times(processes: int = 5) -> list[dict[str, Any]]:
    """First call and the warm calls after it, each in ``processes`` fresh interpreters."""
    rows = []
    for count, fused in CASES:
        firsts: list[float] = []
        warms: list[float] = []
        tensors = 0
        for _ in range(processes):
            arguments = [str(count), str(int(fused)), str(_window(fused))]
            done = subprocess.run(
                [sys.executable, "-c", _FIRST_CALL, *arguments],
                check=True,
                capture_output=True,
                text=True,
            )
            got = json.loads(done.stdout.strip().splitlines()[-1])
            tensors, times = got["tensors"], got["times"]
            firsts.append(times[0] * 1e3)
            warms.extend(t * 1e3 for t in times[1:])
        rows.append(
            {
                "tensors": tensors,
                "largest_is_fused_views": fused,
                "first_ms": firsts,
                "first_median_ms": statistics.median(firsts),
                "warm_median_ms": statistics.median(warms),
            }
        )
    return rows
