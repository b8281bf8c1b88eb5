"""Read safetensors headers only: a file, several files, or a ``model.safetensors.index.json``."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from .._errors import CheckpointError

_MAX_HEADER = 100 << 20  # safetensors' own limit
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


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
            continue
        try:
            dtype, shape, (begin, end) = (
                entry["dtype"],
                tuple(entry["shape"]),
                entry["data_offsets"],
            )
            if not (0 <= begin <= end <= data_bytes):
                raise ValueError(f"bytes {begin}..{end} outside the {data_bytes:,} data bytes")
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(
                f"{path}: corrupt safetensors header at {name!r} ({error})"
            ) from None
        tensors.append(TensorHeader(name, dtype, shape, end - begin, str(path)))
    return tensors


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
