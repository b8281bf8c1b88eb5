"""A race set on which eviction matters: decode GEMMs whose weights fit in L2.

Three Triton tile configurations of one bf16 GEMM kernel (x @ W, W of K x N):
two loop over K without software pipelining (``num_stages=1``: every K step
waits for its loads, so memory latency sets their time, and a warm L2 roughly
halves it) and one wide tile with a 3-stage pipeline (latency hidden; its time
is set by bandwidth and tile work, which warm L2 helps far less). Measured
cold, as a server runs them between other layers' weights, the pipelined tile
wins by about 40%; measured warm, the unpipelined one wins by a few per cent.
The configurations were picked from a pool of ten measured on an H200 (the
pool and the reason are in BENCHMARKS.md); the shapes are a full grid.

Triton is imported only here and only on a GPU machine.
"""

from __future__ import annotations

from typing import Any

import torch

# (BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_M is 16, the smallest tl.dot tile.
CONFIGS: tuple[tuple[int, int, int, int], ...] = (
    (64, 128, 4, 1),
    (128, 128, 4, 1),
    (256, 64, 8, 3),
)

# Decode-shaped (M, N, K): weights of 8 to 32 MiB (bf16), all below the H200's
# 60 MiB L2, x M in {1, 4, 16} tokens: 12 x 3 = 36 races.
WEIGHTS: tuple[tuple[int, int], ...] = (
    (2048, 2048), (4096, 2048), (2048, 4096), (4096, 4096), (6144, 2048), (2048, 6144),
    (1024, 4096), (4096, 1024), (8192, 2048), (2048, 8192), (3072, 3072), (5120, 2048),
)  # fmt: skip
SHAPES: tuple[tuple[int, int, int], ...] = tuple((m, n, k) for n, k in WEIGHTS for m in (1, 4, 16))

_KERNEL: Any = None


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,  # type: ignore[no-untyped-def]
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        # K is a multiple of BK in every shape here, so only M and N are masked.
        for k0 in range(0, K, BK):
            a_tile = tl.load(
                a + rm[:, None] * sam + (k0 + rk)[None, :] * sak, mask=rm[:, None] < M, other=0.0
            )
            b_tile = tl.load(
                b + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn, mask=rn[None, :] < N, other=0.0
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
    """One race: every config in :data:`CONFIGS` on an (M, N, K) bf16 GEMM.

    Each candidate is compiled and run once here, outside the race, as b12x
    requires (nothing may compile inside a timed sample).
    """
    import triton
    from b12x.preparation.types import PreparedCall

    if any(k % bk for _, bk, _, _ in CONFIGS):
        raise ValueError(f"K = {k} must be a multiple of every config's BLOCK_K")
    kernel = _kernel()
    x = torch.empty(m, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(k, n, dtype=torch.bfloat16, device=device) / k**0.5
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)

    def produce() -> None:
        x.normal_()

    calls = []
    for bn, bk, warps, stages in CONFIGS:
        grid = (triton.cdiv(n, bn), triton.cdiv(m, 16))

        def run(grid: tuple[int, int] = grid, bn: int = bn, bk: int = bk,
                warps: int = warps, stages: int = stages) -> None:  # fmt: skip
            kernel[grid](
                x, w, out, m, n, k,
                x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0), out.stride(1),
                BM=16, BN=bn, BK=bk, num_warps=warps, num_stages=stages,
            )  # fmt: skip

        produce()
        run()
        calls.append(PreparedCall(run=run, produce=produce))
    torch.cuda.synchronize(device)
    return calls
