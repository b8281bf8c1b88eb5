"""The embedded example: a small MoE-shaped checkpoint written on the fly."""

from __future__ import annotations

from pathlib import Path

import torch

_HIDDEN = 1024
_LAYERS = 4
_EXPERTS = 16


def example_tensors(window_bytes: int) -> dict[str, torch.Tensor]:
    """DeepSeek-style names; one fused expert block a little larger than ``window_bytes``.

    Values are irrelevant (zeros): the plugin only reads them to displace L2.
    """
    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.zeros(4096, _HIDDEN, dtype=torch.bfloat16),
        "model.norm.weight": torch.zeros(_HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": torch.zeros(4096, _HIDDEN, dtype=torch.bfloat16),
    }
    # The fused w13 block of the last MoE layer is the big storage.
    fused_elements = (window_bytes * 9 // 8) // 2
    inter = max(1, fused_elements // (_EXPERTS * _HIDDEN * 2))
    for layer in range(_LAYERS):
        prefix = f"model.layers.{layer}"
        tensors[f"{prefix}.input_layernorm.weight"] = torch.zeros(_HIDDEN, dtype=torch.bfloat16)
        tensors[f"{prefix}.post_attention_layernorm.weight"] = torch.zeros(
            _HIDDEN, dtype=torch.bfloat16
        )
        for proj, rows in (("q_a_proj", 512), ("kv_a_proj_with_mqa", 576), ("o_proj", _HIDDEN)):
            tensors[f"{prefix}.self_attn.{proj}.weight"] = torch.zeros(
                rows, _HIDDEN, dtype=torch.bfloat16
            )
        tensors[f"{prefix}.mlp.gate.weight"] = torch.zeros(_EXPERTS, _HIDDEN, dtype=torch.bfloat16)
        if layer == _LAYERS - 1:
            tensors[f"{prefix}.mlp.experts.w13_weight"] = torch.zeros(
                _EXPERTS, 2 * inter, _HIDDEN, dtype=torch.bfloat16
            )
        for expert in range(_EXPERTS if layer < _LAYERS - 1 else 0):
            for proj, shape in (("gate_proj", (64, _HIDDEN)), ("down_proj", (_HIDDEN, 64))):
                tensors[f"{prefix}.mlp.experts.{expert}.{proj}.weight"] = torch.zeros(
                    *shape, dtype=torch.bfloat16
                )
    return tensors


def write_example_checkpoint(directory: str | Path, window_bytes: int) -> Path:
    """Write the embedded example to ``directory/model.safetensors`` and return its path."""
    from safetensors.torch import save_file

    path = Path(directory) / "model.safetensors"
    save_file(example_tensors(window_bytes), str(path), metadata={"format": "pt"})
    return path
