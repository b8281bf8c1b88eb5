"""How many bytes a race's L2 eviction reads, and what stock b12x allocates for it (torch-free)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

WORD = 4
"""Bytes of one float32, the element both stock b12x and the plugin read."""

_FLOOR_BYTES = 64 << 20


def stock_window_bytes(l2_cache_bytes: int) -> int:
    """``max(2 x L2, 64 MiB)``: the bytes stock b12x's eviction is asked to read per sample."""
    return max(2 * int(l2_cache_bytes), _FLOOR_BYTES)


def stock_buffer_bytes(l2_cache_bytes: int) -> int:
    """Bytes of the float32 buffer stock b12x allocates, and reads, per race job.

    Its 0-d output is left out on purpose (the plugin allocates one too), so the
    reclaimed figure stays a lower bound.
    """
    return -(-stock_window_bytes(l2_cache_bytes) // WORD) * WORD


def device_l2_bytes(device: torch.device) -> int:
    """The L2 size of a CUDA device, as stock b12x reads it."""
    import torch

    if device.type != "cuda":
        raise ValueError(
            f"{device} has no L2 size to read; the host must pass runtime.l2_cache_bytes"
        )
    return int(torch.cuda.get_device_properties(device).L2_cache_size)
