"""``check --races``'s race set: decode GEMMs on which eviction decides the winner.

The bench's race set (BENCHMARKS.md, the 36 races), cut to 12 and shipped in
the wheel so an operator can run it on the GPU in hand: three Triton tile
configurations of one bf16 GEMM kernel (x @ W, W of K x N, 8 to 32 MiB: it
fits in the L2 of an H100, H200, B200 or GB202, so only eviction makes it cold). Two
loop over K without software pipelining (memory latency sets their time, and a
warm L2 roughly halves it) and one wide tile with a 3-stage pipeline (latency
hidden). Measured cold, as a server runs them, the pipelined tile wins by
about 40%; measured warm, an unpipelined one wins. So a race whose eviction
left the weights warm picks another winner: the set tells a cold eviction
from a warm one, which is what the plugin's read must match.

Triton is imported only here and only on a GPU machine.
"""

from __future__ import annotations

from typing import Any

import torch

CONFIGS: tuple[tuple[int, int, int, int], ...] = (
    (64, 128, 4, 1),
    (128, 128, 4, 1),
    (256, 64, 8, 3),
)
"""(BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_M is 16, the smallest tl.dot tile."""

WEIGHTS: tuple[tuple[int, int], ...] = (
    (2048, 2048), (4096, 2048), (4096, 4096), (2048, 8192), (8192, 2048), (3072, 3072),
)  # fmt: skip
"""(N, K) of the weights: 8 to 32 MiB in bf16."""

SHAPES: tuple[tuple[int, int, int], ...] = tuple((m, n, k) for n, k in WEIGHTS for m in (1, 16))
"""(M, N, K): each weight with 1 and 16 tokens, 12 races."""

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
