"""What the hook costs at start-up, each figure from fresh processes.

* :func:`first_call_times`: the source choice for checkpoints of 1k, 10k and
  100k tensors (CPU), first call in a fresh process and the warm calls after it.
* :func:`hook_times`: ``before_first_capture`` itself, wall time and the
  plugin's own per-step breakdown (``ReclaimReport.seconds`` where the plugin
  reports it), in a fresh interpreter per sample, for each combination of a
  host that has or has not already run a Triton kernel and an empty or a
  pre-filled ``TRITON_CACHE_DIR``.
* :func:`triton_start_times`: what a process pays for Triton itself (``import
  triton``, ``triton_key()``, the first launch of a trivial kernel, cold and
  warm cache), and for importing b12x's measurement module, so the hook's
  figures can be read against what a host that runs Triton has already paid.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._child import child_env

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
from flare_l2evict.tools._choose_weights import choose_weights
from benchmarks.bench import synthetic_checkpoint
count, fused, window = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
tensors = synthetic_checkpoint(count, fused_largest=fused)
times = []
for _ in range(4):
    start = time.perf_counter()
    choose_weights(tensors, "cpu", window_bytes=window)
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
                env=child_env(),
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


# What a host does before the hook, then the hook, timed. argv: device, host_triton (0/1).
# Run from a file, not ``-c``: Triton reads a kernel's source with inspect.getsource.
_HOOK = """
import json, sys, time
began = time.perf_counter()
import torch
device = torch.device(sys.argv[1])
host_triton = sys.argv[2] == "1"
if device.type == "cuda":
    torch.empty(1, device=device)
    torch.cuda.synchronize(device)
host = {"torch_and_context": time.perf_counter() - began}
if host_triton:
    t = time.perf_counter()
    import triton
    import triton.language as tl
    host["import_triton"] = time.perf_counter() - t

    @triton.jit
    def host_kernel(x):
        tl.store(x + tl.arange(0, 16), tl.arange(0, 16).to(tl.float32))

    out = torch.empty(16, device=device)
    t = time.perf_counter()
    host_kernel[(1,)](out)
    torch.cuda.synchronize(device)
    host["host_first_triton_launch"] = time.perf_counter() - t
weights = torch.ones((512 << 20) // 4, device=device)  # resident weights, 512 MiB
if device.type == "cuda":
    torch.cuda.synchronize(device)
b12x_before = "b12x" in sys.modules
t = time.perf_counter()
import flare_l2evict.plugin  # what loading the entry point imports
host["import_plugin"] = time.perf_counter() - t
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator, ReferenceRuntime, plugin_manager,
)
manager = plugin_manager(["l2evict"])
b12x_imported_with_plugin = "b12x" in sys.modules
runtime = ReferenceRuntime(
    device=device, config={}, kv_allocator=ReferenceKVAllocator(1024), race_jobs=5,
    l2_cache_bytes=None if device.type == "cuda" else 60 << 20,  # a CPU has none: the H200's
    tensors={"model.layers.0.mlp.experts.w13_weight": weights},
)
t = time.perf_counter()
report = manager.hook.before_first_capture(runtime=runtime)[0]
wall = time.perf_counter() - t
manager.hook.startup_complete(runtime=runtime)
print(json.dumps({
    "hook_s": wall,
    "seconds": dict(getattr(report, "seconds", None) or {}),
    "host_s": host,
    "read_kernel": report.read_kernel,
    "reclaimed_bytes": report.reclaimed_bytes,
    "reason": report.reason,
    "b12x_imported_before_plugin": b12x_before,
    "b12x_imported_before_hook": b12x_imported_with_plugin,
    "triton_imported_after_hook": "triton" in sys.modules,
}))
"""

HOOK_MODES: tuple[tuple[bool, str], ...] = (
    (False, "empty"),
    (False, "warm"),
    (True, "empty"),
    (True, "warm"),
)
"""(host already ran a Triton kernel, Triton cache), every combination."""


def hook_times(
    device: str = "cuda:0",
    *,
    samples: int = 3,
    modes: Sequence[tuple[bool, str]] = HOOK_MODES,
    log: Callable[[str], None] = print,
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """``before_first_capture`` in fresh processes: ``samples`` per mode, every sample kept.

    ``"empty"``: each sample gets a new, empty ``TRITON_CACHE_DIR``; ``"warm"``:
    all samples share one directory that an untimed run of the same mode filled
    first. Each row holds the samples' raw figures; medians are for the table.
    """
    rows = []
    with tempfile.TemporaryDirectory(prefix="flare-l2evict-hook-") as scratch:
        for host_triton, cache in modes:
            warm_dir = Path(scratch) / f"warm-{int(host_triton)}"
            if cache == "warm":
                _hook_sample(device, host_triton, warm_dir, timeout)  # fills the cache, untimed
            got = []
            for index in range(samples):
                directory = (
                    warm_dir if cache == "warm" else Path(scratch) / f"empty-{host_triton}-{index}"
                )
                got.append(_hook_sample(device, host_triton, directory, timeout))
            row = {"host_runs_triton": host_triton, "triton_cache": cache, "samples": got}
            rows.append(row)
            log(f"hook cost: host runs Triton {host_triton}, cache {cache}: "
                f"{[round(g.get('hook_s', -1), 3) for g in got]} s")  # fmt: skip
    return rows


def _hook_sample(device: str, host_triton: bool, cache: Path, timeout: float) -> dict[str, Any]:
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    script = cache.parent / "hook_sample.py"
    script.write_text(_HOOK)
    done = subprocess.run(
        [sys.executable, str(script), device, str(int(host_triton))],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


_TRITON_START = """
import json, sys, time
import torch
device = torch.device("cuda", 0)
torch.empty(1, device=device)
torch.cuda.synchronize(device)
figures = {}
t = time.perf_counter()
import triton
import triton.language as tl
figures["import_triton"] = time.perf_counter() - t
t = time.perf_counter()
try:  # Triton 3.6 keeps it in triton.runtime.cache; older releases in triton.compiler.compiler
    from triton.runtime.cache import triton_key
except ImportError:
    from triton.compiler.compiler import triton_key
triton_key()
figures["triton_key"] = time.perf_counter() - t


@triton.jit
def trivial(x):
    tl.store(x + tl.arange(0, 16), tl.arange(0, 16).to(tl.float32))


out = torch.empty(16, device=device)
t = time.perf_counter()
trivial[(1,)](out)
torch.cuda.synchronize(device)
figures["first_launch"] = time.perf_counter() - t
t = time.perf_counter()
trivial[(1,)](out)
torch.cuda.synchronize(device)
figures["second_launch"] = time.perf_counter() - t
t = time.perf_counter()
import importlib
from flare_l2evict._b12x.table import rows
importlib.import_module(rows("stock")[0].module_path)
figures["import_b12x_measurement"] = time.perf_counter() - t
print(json.dumps(figures))
"""


def triton_start_times(
    *, samples: int = 3, timeout: float = 300.0, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Triton's own start in fresh processes, with an empty and a pre-filled cache.

    ``triton_key`` is timed on its own before the first launch (it is cached
    per process, so the launch after it no longer pays it): the first launch
    then shows the compile (empty cache) or the load from disk (warm).
    """
    rows = []
    with tempfile.TemporaryDirectory(prefix="flare-l2evict-triton-") as scratch:
        warm = Path(scratch) / "warm"
        for cache in ("empty", "warm"):
            got = []
            if cache == "warm":
                _run_json(_TRITON_START, warm, timeout)  # fills the cache, untimed
            for index in range(samples):
                directory = warm if cache == "warm" else Path(scratch) / f"empty-{index}"
                got.append(_run_json(_TRITON_START, directory, timeout))
            rows.append({"triton_cache": cache, "samples": got})
            log(f"triton start, cache {cache}: done")
    return rows


def _run_json(code: str, cache: Path, timeout: float) -> dict[str, Any]:
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    script = cache.parent / "triton_start.py"  # a file: Triton reads kernels' source
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=timeout
    )
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def _median(values: Sequence[float]) -> str:
    """Seconds shown as milliseconds: median [min-max]."""
    if not values:
        return "-"
    ms = [v * 1e3 for v in values]
    return f"{statistics.median(ms):.1f} [{min(ms):.1f}-{max(ms):.1f}]"


def hook_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The hook's wall time per mode, and each step the plugin reported, median [min-max] ms."""
    lines = []
    for row in rows:
        good = [s for s in row["samples"] if "error" not in s]
        mode = (
            f"host {'runs Triton' if row['host_runs_triton'] else 'no Triton  '}, "
            f"cache {row['triton_cache']:<5}"
        )
        if not good:
            lines.append(f"{mode}: {row['samples'][0].get('error', '?')[:300]}")
            continue
        steps: dict[str, list[float]] = {}
        for sample in good:
            for name, value in sample["seconds"].items():
                steps.setdefault(name, []).append(value)
        kernels = sorted({str(s["read_kernel"]) for s in good})
        reasons = sorted({s["reason"] for s in good if s.get("reason")})
        shown = "; ".join(f"{name} {_median(v)}" for name, v in steps.items() if name != "total")
        lines.append(
            f"{mode}: hook {_median([s['hook_s'] for s in good])} ms over {len(good)} fresh "
            f"processes, read {'/'.join(kernels)}"
            + (f"; plugin total {_median(steps['total'])}" if "total" in steps else "")
            + (f"; steps: {shown}" if shown else "; steps: (the plugin reports none)")
            + (f"; reason: {' | '.join(reasons)[:200]}" if reasons else "")
        )
        imports = [
            s["host_s"]["import_plugin"] for s in good if "import_plugin" in s.get("host_s", {})
        ]
        if imports:  # paid when the host loads the entry point, before the hook
            lines[-1] += f"; before the hook, importing the plugin took {_median(imports)} ms"
    return lines


def triton_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        good = [s for s in row["samples"] if "error" not in s]
        if not good:
            lines.append(
                f"cache {row['triton_cache']}: {row['samples'][0].get('error', '?')[:300]}"
            )
            continue
        names = list(good[0])
        shown = "; ".join(f"{n} {_median([g[n] for g in good])}" for n in names)
        lines.append(f"Triton start, cache {row['triton_cache']:<5} (ms): {shown}")
    return lines
