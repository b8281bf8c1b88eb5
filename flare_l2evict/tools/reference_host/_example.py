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


def _deepseek_class_tensors(layers: int, experts: int) -> list[tuple[str, str, tuple[int, ...]]]:
    hidden, inter, vocab, q_rank, kv_rank = 7168, 2048, 129280, 1536, 512
    tensors: list[tuple[str, str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", "BF16", (vocab, hidden)),
        ("model.norm.weight", "BF16", (hidden,)),
        ("lm_head.weight", "BF16", (vocab, hidden)),
    ]
    for layer in range(layers):
        p = f"model.layers.{layer}"
        tensors += [
            (f"{p}.input_layernorm.weight", "BF16", (hidden,)),
            (f"{p}.post_attention_layernorm.weight", "BF16", (hidden,)),
            (f"{p}.self_attn.q_a_proj.weight", "F8_E4M3", (q_rank, hidden)),
            (f"{p}.self_attn.q_b_proj.weight", "F8_E4M3", (128 * 192, q_rank)),
            (f"{p}.self_attn.kv_a_proj_with_mqa.weight", "F8_E4M3", (kv_rank + 64, hidden)),
            (f"{p}.self_attn.kv_b_proj.weight", "F8_E4M3", (128 * 256, kv_rank)),
            (f"{p}.self_attn.o_proj.weight", "F8_E4M3", (hidden, 128 * 128)),
        ]
        if layer < 3:
            for proj, shape in (("gate_proj", (18432, hidden)), ("down_proj", (hidden, 18432))):
                tensors.append((f"{p}.mlp.{proj}.weight", "F8_E4M3", shape))
            continue
        tensors.append((f"{p}.mlp.gate.weight", "BF16", (experts, hidden)))
        for e in range(experts):
            for proj, (rows, cols) in (
                ("gate_proj", (inter, hidden)),
                ("up_proj", (inter, hidden)),
                ("down_proj", (hidden, inter)),
            ):
                name = f"{p}.mlp.experts.{e}.{proj}"
                tensors.append((f"{name}.weight", "F8_E4M3", (rows, cols)))
                tensors.append((f"{name}.weight_scale_inv", "F32", (rows // 128, cols // 128)))
    return tensors


def write_sparse_index(
    directory: str | Path, *, files: int = 160, layers: int = 61, experts: int = 256
) -> Path:
    """A DeepSeek-class sharded checkpoint whose data are holes: headers are real.

    Writes ``files`` safetensors files (valid headers, data regions left as
    sparse holes, so ~700 GB of weights take no disk) and their
    ``model.safetensors.index.json``. The defaults give about 90,000 tensors.
    """
    import json
    import math

    widths = {"BF16": 2, "F8_E4M3": 1, "F32": 4}
    directory = Path(directory)
    tensors = _deepseek_class_tensors(layers, experts)
    per_file = math.ceil(len(tensors) / files)
    weight_map: dict[str, str] = {}
    for index in range(files):
        chunk = tensors[index * per_file : (index + 1) * per_file]
        name = f"model-{index + 1:05d}-of-{files:05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for tensor, dtype, shape in chunk:
            nbytes = math.prod(shape) * widths[dtype]
            header[tensor] = {
                "dtype": dtype,
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
            weight_map[tensor] = name
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with (directory / name).open("wb") as handle:
            handle.write(len(raw).to_bytes(8, "little") + raw)
            handle.truncate(8 + len(raw) + offset)
    index_path = directory / "model.safetensors.index.json"
    index_path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index_path
