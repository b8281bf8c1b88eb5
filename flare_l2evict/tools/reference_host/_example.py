"""The embedded example: a small MoE-shaped checkpoint written on the fly."""

from __future__ import annotations

from pathlib import Path

import torch

_HIDDEN = 1024
_LAYERS = 4
_EXPERTS = 16


Spec = tuple[str, str, tuple[int, ...]]
"""One tensor of a checkpoint written from headers alone: name, safetensors dtype, shape."""

_WIDTHS = {"BF16": 2, "F8_E4M3": 1, "F32": 4}


def example_specs(window_bytes: int) -> list[Spec]:
    """The embedded example's tensors: DeepSeek-style names, all BF16.

    One fused expert block (the last MoE layer's ``w13_weight``) is a little
    larger than ``window_bytes``: that is the storage the plugin reads.
    """
    specs: list[Spec] = [
        ("model.embed_tokens.weight", "BF16", (4096, _HIDDEN)),
        ("model.norm.weight", "BF16", (_HIDDEN,)),
        ("lm_head.weight", "BF16", (4096, _HIDDEN)),
    ]
    fused_elements = (window_bytes * 9 // 8) // 2
    inter = max(1, fused_elements // (_EXPERTS * _HIDDEN * 2))
    for layer in range(_LAYERS):
        prefix = f"model.layers.{layer}"
        specs.append((f"{prefix}.input_layernorm.weight", "BF16", (_HIDDEN,)))
        specs.append((f"{prefix}.post_attention_layernorm.weight", "BF16", (_HIDDEN,)))
        for proj, rows in (("q_a_proj", 512), ("kv_a_proj_with_mqa", 576), ("o_proj", _HIDDEN)):
            specs.append((f"{prefix}.self_attn.{proj}.weight", "BF16", (rows, _HIDDEN)))
        specs.append((f"{prefix}.mlp.gate.weight", "BF16", (_EXPERTS, _HIDDEN)))
        if layer == _LAYERS - 1:
            fused = (_EXPERTS, 2 * inter, _HIDDEN)
            specs.append((f"{prefix}.mlp.experts.w13_weight", "BF16", fused))
        for expert in range(_EXPERTS if layer < _LAYERS - 1 else 0):
            for proj, shape in (("gate_proj", (64, _HIDDEN)), ("down_proj", (_HIDDEN, 64))):
                specs.append((f"{prefix}.mlp.experts.{expert}.{proj}.weight", "BF16", shape))
    return specs


def example_tensors(window_bytes: int) -> dict[str, torch.Tensor]:
    """The embedded example in memory; values are irrelevant (zeros): the plugin only reads them."""
    return {
        name: torch.zeros(*shape, dtype=torch.bfloat16)
        for name, _, shape in example_specs(window_bytes)
    }


def write_headers(path: str | Path, specs: list[Spec]) -> Path:
    """Write a safetensors file of zeros from ``specs``, its data region left as a sparse hole.

    The file is what ``save_file`` of zero tensors gives (a valid header, the
    tensors in order, every value 0) without writing the zeros: a hole reads as
    zeros, so a 300 MiB example costs no disk on file systems with holes.
    """
    head, size = safetensors_head(specs)
    path = Path(path)
    with path.open("wb") as handle:
        handle.write(head)
        handle.truncate(size)
    return path


def safetensors_head(specs: list[Spec]) -> tuple[bytes, int]:
    """The bytes before the data of :func:`write_headers`'s file, and the file's whole size."""
    import json
    import math

    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in specs:
        nbytes = math.prod(shape) * _WIDTHS[dtype]
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, 8 + len(raw) + offset


def write_example_checkpoint(directory: str | Path, window_bytes: int) -> Path:
    """Write the embedded example to ``directory/model.safetensors`` and return its path."""
    return write_headers(Path(directory) / "model.safetensors", example_specs(window_bytes))


def _deepseek_class_tensors(layers: int, experts: int) -> list[Spec]:
    hidden, inter, vocab, q_rank, kv_rank = 7168, 2048, 129280, 1536, 512
    tensors: list[Spec] = [
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

    directory = Path(directory)
    tensors = _deepseek_class_tensors(layers, experts)
    per_file = math.ceil(len(tensors) / files)
    weight_map: dict[str, str] = {}
    for index in range(files):
        chunk = tensors[index * per_file : (index + 1) * per_file]
        name = f"model-{index + 1:05d}-of-{files:05d}.safetensors"
        write_headers(directory / name, chunk)
        weight_map |= dict.fromkeys((tensor for tensor, _, _ in chunk), name)
    index_path = directory / "model.safetensors.index.json"
    index_path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index_path
