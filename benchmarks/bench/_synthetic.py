"""Synthetic DeepSeek-class checkpoints for timing the source choice (CPU)."""

from __future__ import annotations

import torch


def synthetic_checkpoint(count: int, *, fused_largest: bool = False) -> dict[str, torch.Tensor]:
    """About ``count`` tiny tensors shaped like a DeepSeek-class MoE checkpoint.

    Per layer: 256 experts x 3 projections x (weight, scale) as views of one
    fused storage, plus attention and norm tensors with their own storages,
    and one larger expert block. ``fused_largest`` drops that block, so the
    largest storages are dozens of equal fused blocks with 1,536 views each:
    the worst case for naming and tie-breaking. Only count and sharing matter.
    """
    tensors: dict[str, torch.Tensor] = {}
    layer = 0
    while len(tensors) < count:
        fused = torch.empty(256 * 3 * 2 * 4)
        views = iter(torch.split(fused, 4))
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
    chosen = {name: tensors[name] for name in list(tensors)[:count]}
    if not fused_largest:
        chosen["model.layers.3.mlp.experts.w13_weight"] = torch.empty(1 << 20)
    return chosen
