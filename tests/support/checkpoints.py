"""Checkpoint files the tests write without writing their zeros."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from flare_l2evict.tools.reference_host._example import write_headers


def sparse_zeros(path: Path, shapes: Mapping[str, tuple[int, ...]]) -> Path:
    """A float32 safetensors file of zeros, as ``save_file`` of ``torch.zeros`` tensors writes
    it, but its data a sparse hole: the same file for ``plan`` and ``check`` (they read the
    header) and for a start-up (it loads zeros), without a test allocating and writing them.
    """
    return write_headers(path, [(name, "F32", shape) for name, shape in shapes.items()])
