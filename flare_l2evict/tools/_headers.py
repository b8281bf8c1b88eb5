"""Read safetensors headers only: a file, several files, or a ``model.safetensors.index.json``."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from .._errors import CheckpointError

_MAX_HEADER = 100 << 20  # safetensors' own limit
_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "E8M0": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "I64": 64, "U64": 64, "F64": 64,
}  # fmt: skip
"""Bits per element of every dtype safetensors' loader accepts."""


class TensorHeader(NamedTuple):
    """One tensor as its header describes it; ``nbytes`` is its span in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str


def read_header(path: Path) -> list[TensorHeader]:
    """The tensors of one safetensors file, from its header alone.

    Checks what a loader would trip on later: the header's length and JSON,
    each entry's fields, and that every tensor's bytes lie inside the file.
    Raises :class:`CheckpointError` naming the file and the problem.
    """
    if not path.is_file():
        raise CheckpointError(f"{path}: no such safetensors file; fix: check the path")
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(
                    f"{path}: corrupt safetensors header (file shorter than 8 bytes)"
                )
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER or 8 + length > size:
                raise CheckpointError(
                    f"{path}: corrupt safetensors header (declares {length:,} header bytes in a "
                    f"{size:,}-byte file)"
                )
            header = json.loads(handle.read(length))
    except CheckpointError:
        raise
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: corrupt safetensors header ({error})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_bytes = size - 8 - length
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise CheckpointError(
                    f"{path}: corrupt safetensors header (__metadata__ must map strings to "
                    "strings); fix: re-export the checkpoint"
                )
            continue
        try:
            tensors.append(_entry(name, entry, data_bytes, str(path)))
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(
                f"{path}: corrupt safetensors header at {name!r} ({error}); fix: re-export or "
                "re-download the file"
            ) from None
    _check_layout(path, header, data_bytes)
    return tensors


def _entry(name: str, entry: object, data_bytes: int, file: str) -> TensorHeader:
    """One tensor's entry, checked as safetensors' loader checks it."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ValueError("needs exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in _DTYPE_BITS:
        raise ValueError(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError("shape must be a list of non-negative whole numbers")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise ValueError("data_offsets must be [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise ValueError(f"bytes {begin}..{end} outside the {data_bytes:,} data bytes")
    elements = 1
    for d in shape:
        elements *= d
    bits = elements * _DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != end - begin:
        raise ValueError(
            f"{dtype} {shape} needs {bits / 8:,g} bytes, the offsets span {end - begin:,}"
        )
    return TensorHeader(name, dtype, tuple(shape), end - begin, file)


def _check_layout(path: Path, header: dict[str, object], data_bytes: int) -> None:
    """Tensors must tile the data section exactly, as safetensors' loader requires."""
    spans = sorted(
        tuple(entry["data_offsets"])  # type: ignore[index]
        for name, entry in header.items()
        if name != "__metadata__"
    )
    position = 0
    for begin, end in spans:
        if begin != position:
            raise CheckpointError(
                f"{path}: corrupt safetensors header (tensor data at byte {begin:,} where "
                f"{position:,} was expected: gap or overlap); fix: re-export the checkpoint"
            )
        position = end
    if position != data_bytes:
        raise CheckpointError(
            f"{path}: corrupt safetensors header (tensors cover {position:,} of the "
            f"{data_bytes:,} data bytes); fix: re-export or re-download the file"
        )


def read_index(path: Path) -> list[TensorHeader]:
    """Every tensor of a sharded checkpoint, through its ``weight_map``."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path}: not a safetensors index ({error!s})") from None
    if not weight_map:
        raise CheckpointError(f"{path}: the index names no tensors; fix: point at a complete index")
    files = sorted(set(weight_map.values()))
    for name in files:
        if not (path.parent / name).is_file():
            raise CheckpointError(
                f"{path}: shard {name!r} named in the index is missing from {path.parent}; "
                "fix: download the whole checkpoint"
            )
    tensors: list[TensorHeader] = []
    for name in files:
        tensors.extend(read_header(path.parent / name))
    listed = set(weight_map)
    return [t for t in tensors if t.name in listed]


def read_checkpoint(paths: Sequence[Path]) -> list[TensorHeader]:
    """Headers of one checkpoint given as files and/or index files."""
    tensors: list[TensorHeader] = []
    for path in paths:
        if path.name.endswith(".index.json"):
            tensors.extend(read_index(path))
        else:
            tensors.extend(read_header(path))
    if not tensors:
        raise CheckpointError(f"{', '.join(map(str, paths))}: no tensors in the checkpoint")
    return tensors
