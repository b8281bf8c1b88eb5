"""A GPU's allocator at rest before a byte figure's base: the one helper the GPU tests share.

A neighbour's leftovers (a failed test's tensors kept alive by its traceback's cycle, a
cached block) must not move a figure: each measurement collects, synchronises and empties
the cache first, then takes its own base.
"""

from __future__ import annotations

import gc

import torch


def settled(device: torch.device) -> None:
    """Garbage collected, ``device``'s queued work done, and torch's cache given back."""
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
