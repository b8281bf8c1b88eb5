"""Which read of a 2 x L2 window is cheapest and evicts best? (GPU; prints figures.)

Compares torch reductions of different shapes and dtypes, and the plugin's own
eviction with each of its kernels (the Triton read, torch's row reduction):
time per call against a 1 GiB read measured in the same run, and the coldness
of L2-resident probes (1/8 and 1/2 of L2) right after each.

    python -m benchmarks.eviction_kernels
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from benchmarks.bench import Probe, compare, time_call
from flare_l2evict._eviction import WeightEviction
from flare_l2evict.tools._choose_weights import choose_weights
from flare_l2evict.tools._origin import stock_row


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
    variants: dict[str, Callable[[], None]] = {}
    for rows in (1024, 8192, 131072):
        out = torch.empty(rows, dtype=torch.float32, device=device)
        view = tail.view(rows, -1)

        def sum_rows(v: torch.Tensor = view, o: torch.Tensor = out) -> None:
            torch.sum(v, dim=1, out=o)

        variants[f"sum fp32 rows={rows}"] = sum_rows
    half = tail.view(torch.bfloat16).view(8192, -1)
    out_half = torch.empty(8192, dtype=torch.bfloat16, device=device)

    def sum_bf16() -> None:
        torch.sum(half, dim=1, out=out_half)

    variants["sum bf16 rows=8192"] = sum_bf16
    ints = tail.view(torch.int32).view(8192, -1)
    out_int = torch.empty(8192, dtype=torch.int32, device=device)

    def amax_int32() -> None:
        torch.amax(ints, dim=1, out=out_int)

    variants["amax int32 rows=8192"] = amax_int32
    one = torch.empty((), dtype=torch.float32, device=device)

    def sum_to_0d() -> None:
        torch.sum(tail, dim=0, out=one)

    variants["sum fp32 to 0-d, weights"] = sum_to_0d
    row = stock_row()
    variants[f"b12x stock {row.function}"] = getattr(
        importlib.import_module(row.module_path), row.function
    )(device, enabled=True)
    choice = choose_weights({"weights": weights}, device, window)
    for kernel in ("auto", "torch"):
        eviction = WeightEviction(choice, kernel=kernel)
        variants[f"plugin, {eviction.kernel} read"] = eviction
    floor_us = window / floor_bw * 1e6
    print(
        f"window {window / 2**20:.0f} MiB, HBM read {floor_bw / 1e12:.2f} TB/s, "
        f"floor {floor_us:.1f} us"
    )
    probes = {f: Probe(int(l2 * f) // 4 * 4, device) for f in (0.125, 0.5)}
    sink = torch.empty(8192, dtype=torch.float32, device=device)

    def cold() -> None:
        torch.sum(big.view(8192, -1), dim=1, out=sink)

    coldness: dict[str, list[float]] = {}
    for probe in probes.values():
        conditions: dict[str, Callable[[], None]] = {"warm": probe, "cold": cold, **variants}
        times = compare(conditions, probe, repetitions=480, rounds=8, device=device)
        warm, hot = times["warm"].trimmed_mean, times["cold"].trimmed_mean
        for name in variants:
            coldness.setdefault(name, []).append((times[name].trimmed_mean - warm) / (hot - warm))
    print(f"{'variant':28s} {'us':>7}  {'x floor':>7}  coldness 1/8 L2, 1/2 L2")
    for name, call in variants.items():
        t = time_call(call, repetitions=256, device=device)
        shown = ", ".join(f"{c:.3f}" for c in coldness[name])
        print(f"{name:28s} {t.median:7.1f}  {t.median / floor_us:7.2f}  {shown}")


if __name__ == "__main__":
    main()
