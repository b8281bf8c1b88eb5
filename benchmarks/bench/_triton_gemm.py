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

The kernel, its tile configurations and one race's calls are `check --races`'s
(:mod:`flare_l2evict.tools._race_set`, shipped in the wheel); the bench runs
them over a larger grid of shapes.
"""

from __future__ import annotations

from flare_l2evict.tools._race_set import CONFIGS, gemm_race

__all__ = ["CONFIGS", "SHAPES", "WEIGHTS", "gemm_race"]

# Decode-shaped (M, N, K): weights of 8 to 32 MiB (bf16), all below the H200's
# 60 MiB L2, x M in {1, 4, 16} tokens: 12 x 3 = 36 races.
WEIGHTS: tuple[tuple[int, int], ...] = (
    (2048, 2048), (4096, 2048), (2048, 4096), (4096, 4096), (6144, 2048), (2048, 6144),
    (1024, 4096), (4096, 1024), (8192, 2048), (2048, 8192), (3072, 3072), (5120, 2048),
)  # fmt: skip
SHAPES: tuple[tuple[int, int, int], ...] = tuple((m, n, k) for n, k in WEIGHTS for m in (1, 4, 16))
