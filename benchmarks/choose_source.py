"""Time the source choice on synthetic checkpoints of 1k, 10k and 100k tensors (CPU).

DeepSeek-class shape: per layer, 256 experts x 3 projections x (weight, scale)
as views of one fused storage per layer, plus attention and norm tensors with
their own storages, and one larger expert block. The last row drops that block,
so the largest storages are the 66 equal-size fused blocks with 1,536 views
each: the worst case for naming and tie-breaking. Tensors are tiny; only the
count and the sharing matter.
Prints figures; asserts nothing about time.

    python benchmarks/choose_source.py
"""

from __future__ import annotations

import platform
import statistics
import time

import torch

from flare_l2evict import choose_source


def synthetic(count: int, *, fused_largest: bool = False) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    layer = 0
    while len(tensors) < count:
        fused = torch.empty(256 * 3 * 2 * 4)
        views = iter(fused.split(4))
        prefix = f"model.layers.{layer}"
        for expert in range(256):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                tensors[f"{prefix}.mlp.experts.{expert}.{proj}.weight"] = next(views)
                tensors[f"{prefix}.mlp.experts.{expert}.{proj}.weight_scale_inv"] = next(views)
        for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            tensors[f"{prefix}.self_attn.{name}.weight"] = torch.empty(4)
        for name in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"{prefix}.{name}.weight"] = torch.empty(4)
        layer += 1
    names = list(tensors)[:count]
    chosen = {name: tensors[name] for name in names}
    if not fused_largest:
        chosen["model.layers.3.mlp.experts.w13_weight"] = torch.empty(1 << 20)  # the big one
    return chosen


def main() -> None:
    print(f"CPU: {platform.processor() or platform.machine()}, torch {torch.__version__}")
    rows = []
    cases = [(n, False) for n in (1_000, 10_000, 100_000)] + [(100_000, True)]
    for count, fused in cases:
        tensors = synthetic(count, fused_largest=fused)
        window = 4096 if fused else 1 << 21
        times = []
        for _ in range(7):
            start = time.perf_counter()
            choice = choose_source(tensors, "cpu", window_bytes=window)
            times.append(time.perf_counter() - start)
        values = list(tensors.values())
        start = time.perf_counter()
        list(map(id, values))
        floor = time.perf_counter() - start
        name = choice.name + (" (largest = 66 equal fused blocks)" if fused else "")
        rows.append((len(tensors), statistics.median(times), min(times), floor, name))
    print()
    print(f"{'tensors':>8}  {'median ms':>9}  {'best ms':>8}  {'map(id) ms':>10}  choice")
    for count, median, best, floor, name in rows:
        print(
            f"{count:>8,}  {median * 1e3:>9.1f}  {best * 1e3:>8.1f}  {floor * 1e3:>10.1f}  {name}"
        )
    print("map(id): one trivial C call per tensor on this machine, the floor of any Python pass")


if __name__ == "__main__":
    main()
