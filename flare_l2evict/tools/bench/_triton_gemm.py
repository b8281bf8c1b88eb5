"""Race candidates that differ clearly: Triton matmul tile configurations.

Triton is imported only here and only on a GPU machine.
"""

from __future__ import annotations

from typing import Any

import torch

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): small tiles suit decode
# shapes, large ones prefill; the spread makes winners clear but not trivial.
CONFIGS: tuple[tuple[int, int, int, int, int], ...] = (
    (16, 64, 128, 4, 4),
    (32, 128, 64, 4, 4),
    (64, 128, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
)

# Decode- and prefill-shaped GEMMs (M, N, K): 5 weight shapes x 4 token counts = 20 races.
SHAPES: tuple[tuple[int, int, int], ...] = tuple(
    (m, n, k)
    for n, k in ((4096, 4096), (7168, 2048), (2048, 7168), (14336, 4096), (4096, 14336))
    for m in (1, 16, 512, 4096)
)

_KERNEL: Any = None


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,  # type: ignore[no-untyped-def]
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a_tile = tl.load(
                a + rm[:, None] * sam + (k0 + rk)[None, :] * sak,
                mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K),
                other=0.0,
            )
            b_tile = tl.load(
                b + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn,
                mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N),
                other=0.0,
            )
            acc += tl.dot(a_tile, b_tile)
        tl.store(
            c + rm[:, None] * scm + rn[None, :] * scn,
            acc.to(tl.bfloat16),
            mask=(rm[:, None] < M) & (rn[None, :] < N),
        )

    _KERNEL = matmul
    return matmul


def gemm_race(m: int, n: int, k: int, device: torch.device) -> list[Any]:
    """One race: every config in :data:`CONFIGS` on an (M, N, K) bf16 GEMM."""
    import triton
    from b12x.preparation.types import PreparedCall

    kernel = _kernel()
    x = torch.empty(m, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(k, n, dtype=torch.bfloat16, device=device) / k**0.5
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)

    def produce() -> None:
        x.normal_()

    calls = []
    for bm, bn, bk, warps, stages in CONFIGS:
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))

        def run(grid: tuple[int, int] = grid, bm: int = bm, bn: int = bn, bk: int = bk,
                warps: int = warps, stages: int = stages) -> None:  # fmt: skip
            kernel[grid](
                x, w, out, m, n, k,
                x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0), out.stride(1),
                BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages,
            )  # fmt: skip

        calls.append(PreparedCall(run=run, produce=produce))
    return calls
