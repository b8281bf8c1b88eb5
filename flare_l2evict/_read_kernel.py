"""The eviction's read kernel: a plain Triton read where Triton loads, ``None`` otherwise.

Why: on an H200 torch's row reductions over a 120 MiB window reach 1.18 to 1.21 x the HBM read
floor, this read 1.09 x (BENCHMARKS.md). Invariants the eviction relies on: :func:`triton_reads`
compiles and runs every launch, and synchronises, before it returns (b12x's races forbid
compiling inside a sample), so a later launch never synchronises, allocates nothing and can be
captured in a CUDA graph; a launch only reads its view and writes at most ``len(partial)``
float32 sums; it covers at most ``_MAX_ELEMENTS`` elements, so 32-bit offsets cannot overflow.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from functools import partial as partial_call
from typing import Any

import torch

# 512 float32 per load step, 8 steps per program, 4 warps: the fastest of the
# configurations measured on an H200 (1.09 x floor), within noise of the others.
_LOAD_ELEMENTS = 512
_ITERS = 8
_WARPS = 4
_MAX_ELEMENTS = 1 << 30


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def read(x, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK * ITERS
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for base in range(pid * BLOCK * ITERS, n, step):
            for i in tl.static_range(ITERS):
                offsets = base + i * BLOCK + tl.arange(0, BLOCK)
                # .cg: through L2 only, which is the cache to displace.
                acc += tl.load(x + offsets, mask=offsets < n, other=0.0, cache_modifier=".cg")
        tl.store(out + pid, tl.sum(acc))

    return read


def triton_reads(
    views: Sequence[torch.Tensor], partial: torch.Tensor
) -> tuple[list[Callable[[], None]] | None, str]:
    """Warmed launchers reading ``views`` into ``partial``; ``(None, why)`` where Triton cannot."""

    if partial.device.type != "cuda":
        return None, f"{partial.device} is not a CUDA device"
    try:
        kernel = _kernel()
        launches: list[Callable[[], None]] = []
        slots = partial.numel()
        for view in views:
            for start in range(0, view.numel(), _MAX_ELEMENTS):
                chunk = view[start : start + _MAX_ELEMENTS]
                n = chunk.numel()
                grid = (min(slots, -(-n // (_LOAD_ELEMENTS * _ITERS))),)
                launches.append(partial_call(_launch, kernel, grid, chunk, partial, n))
        for launch in launches:
            launch()
        torch.cuda.synchronize(partial.device)
    except Exception as error:  # no Triton, no compiler, or a driver that refuses the module
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return None, f"Triton read kernel unavailable ({reason.strip()})"
    return launches, "triton"


def _launch(kernel: Any, grid: tuple[int], x: torch.Tensor, out: torch.Tensor, n: int) -> None:
    kernel[grid](x, out, n, BLOCK=_LOAD_ELEMENTS, ITERS=_ITERS, num_warps=_WARPS)
