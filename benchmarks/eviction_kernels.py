"""Which read of a 2 x L2 window gets closest to the HBM floor? (GPU; prints figures.)

Compares torch reductions of different shapes and dtypes, and a plain Triton
read kernel, against a 1 GiB read measured in the same run.

    python benchmarks/eviction_kernels.py
"""

from __future__ import annotations

import torch

from flare_l2evict.bench import time_call


def main() -> None:
    device = torch.device("cuda", 0)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    window = max(2 * l2, 64 << 20)
    big = torch.ones(1 << 28, dtype=torch.float32, device=device)
    part = torch.empty(8192, dtype=torch.float32, device=device)

    def read_1g() -> None:
        torch.sum(big.view(8192, -1), dim=1, out=part)

    floor_bw = big.numel() * 4 / (time_call(read_1g, repetitions=64, device=device).median * 1e-6)
    weights = torch.ones(window // 4 * 4, dtype=torch.float32, device=device)
    tail = weights[-(window // 4) :]
    variants = {}
    for rows in (132, 1024, 8192, 32768, 131072):
        out = torch.empty(rows, dtype=torch.float32, device=device)
        view = tail.view(rows, -1)
        variants[f"sum fp32 rows={rows}"] = lambda v=view, o=out: torch.sum(v, dim=1, out=o)
    half = tail.view(torch.bfloat16).view(8192, -1)
    out_half = torch.empty(8192, dtype=torch.bfloat16, device=device)
    variants["sum bf16 rows=8192"] = lambda: torch.sum(half, dim=1, out=out_half)
    ints = tail.view(torch.int32).view(8192, -1)
    out_int = torch.empty(8192, dtype=torch.int32, device=device)
    variants["amax int32 rows=8192"] = lambda: torch.amax(ints, dim=1, out=out_int)
    one = torch.empty((), dtype=torch.float32, device=device)
    variants["sum fp32 to 0-d (stock)"] = lambda: torch.sum(tail, dim=0, out=one)
    try:
        variants.update(_triton_variants(tail))
    except Exception as error:  # Triton is optional here
        print(f"triton variants skipped: {error}")
    floor_us = window / floor_bw * 1e6
    print(
        f"window {window / 2**20:.0f} MiB, HBM read {floor_bw / 1e12:.2f} TB/s, "
        f"floor {floor_us:.1f} us"
    )
    for name, call in variants.items():
        t = time_call(call, repetitions=256, device=device)
        print(f"{name:28s} {t.median:7.1f} us  {t.median / floor_us:5.2f} x floor")


def _triton_variants(tail: torch.Tensor) -> dict[str, object]:
    import triton
    import triton.language as tl

    @triton.jit
    def read(x, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        base = pid * BLOCK * ITERS
        for i in range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x + offs, mask=offs < n, other=0.0, cache_modifier=".cg")
        tl.store(out + pid, tl.sum(acc))

    n = tail.numel()
    variants = {}
    for block, iters in ((1024, 8), (2048, 16), (4096, 16)):
        grid = triton.cdiv(n, block * iters)
        out = torch.empty(grid, dtype=torch.float32, device=tail.device)
        variants[f"triton block={block} iters={iters}"] = lambda g=grid, o=out, b=block, it=iters: (
            read[(g,)](tail, o, n, BLOCK=b, ITERS=it)
        )
    return variants


if __name__ == "__main__":
    main()
