"""The eviction callable: a read-only pass over a window of resident weights."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal

import torch

from ._read_kernel import triton_reads
from ._source import SourceChoice

log = logging.getLogger("flare_l2evict.eviction")

_ELEMENT = 4  # bytes of float32, the dtype stock b12x reduces over
# Rows of the main reduction. A full reduction to one scalar makes torch stage
# partial sums in a temporary it allocates on every call (3 KiB measured on an
# H200); reducing each of this many rows into a preallocated vector does not.
_ROWS = 8192
_BLOCK = 512  # allocation granularity of torch's CUDA caching allocator

EVICTION_OWN_BYTES = -(-_ROWS * _ELEMENT // _BLOCK) * _BLOCK + _BLOCK
"""Device bytes one eviction allocates for its outputs (rounded up to allocator blocks).

They are what the eviction holds in torch's allocator, in place of stock's buffers.
"""
READ_KERNEL_BYTES = 2 << 20
"""Device memory charged for the read kernel's code: one 2 MiB driver page.

Loading a kernel module takes device memory outside torch's allocator; the GPU
test measures the Triton read's load with ``cudaMemGetInfo`` and checks it
stays within this. Charged whichever kernel runs (torch's reduction is loaded
lazily too), so the credit does not depend on whether Triton loaded.
"""
OWN_BYTES = EVICTION_OWN_BYTES + READ_KERNEL_BYTES
"""What the credit subtracts, once per process: the outputs and the kernel's code."""

Kernel = Literal["auto", "torch"]


def read_bytes_for(storage_bytes: Sequence[int], window_bytes: int) -> int:
    """Bytes a :class:`WeightEviction` reads from storages of these sizes, largest first.

    Whole float32 words from the tail of each storage until ``window_bytes``
    (rounded down to whole words) is covered; the offline plan uses it too.
    """
    remaining = window_bytes // _ELEMENT
    read = 0
    for nbytes in storage_bytes:
        if remaining <= 0:
            break
        count = min(nbytes // _ELEMENT, remaining)
        read += count
        remaining -= count
    return read * _ELEMENT


class WeightEviction:
    """Displace L2 by reading the tail of the chosen storages; write nothing to them.

    Invariants a caller relies on:

    * a call allocates no memory and does not synchronise with the host, so it
      can sit before every timed sample and be captured in a CUDA graph;
    * the only memory written is a small float32 output (``_ROWS`` partial
      sums and one scalar) owned by this object, so calls from several race
      jobs may interleave;
    * on CUDA the read is the Triton kernel of :mod:`._read_kernel`, compiled
      and run once here (in the hook, before any race); where Triton cannot
      load it is torch's row reduction, and :attr:`kernel` says which
      (``kernel="torch"`` asks for the reduction);
    * the reads cover ``window_bytes`` (rounded down to whole float32 words),
      taken from the end of each storage, largest storage first;
    * while installed it holds the storages, so they cannot be freed underneath
      it; :meth:`release` drops them. A call after :meth:`release`, or after a
      storage shrank (``resize_(0)``), runs ``fallback`` instead: stock b12x's
      own eviction, allocated then, with one WARNING line.
    """

    def __init__(
        self,
        choice: SourceChoice,
        *,
        fallback: Callable[[], Callable[[], None] | None] | None = None,
        kernel: Kernel = "auto",
    ) -> None:
        self.window_bytes = choice.window_bytes
        self.device = choice.device
        self.source_name = choice.name
        self._fallback_factory = fallback
        self._fallback: Callable[[], None] | None = None
        self._partial = torch.zeros(_ROWS, dtype=torch.float32, device=self.device)
        self._out = torch.zeros((), dtype=torch.float32, device=self.device)
        self._views: list[torch.Tensor] = []  # 1-d, one per storage, as read
        self._reads: list[tuple[torch.Tensor, torch.Tensor]] = []  # (input, its output)
        self._needed: list[tuple[torch.UntypedStorage, int]] = []
        remaining = choice.window_bytes // _ELEMENT
        for source in choice.storages:
            if remaining <= 0:
                break
            elements = source.nbytes // _ELEMENT
            count = min(elements, remaining)
            # The tail, not the head: heads of weight storages are what a
            # forward pass touches first, tails are least likely to be warm.
            view = torch.empty(0, dtype=torch.float32, device=self.device)
            view.set_(source.storage, elements - count, (count,), (1,))
            self._views.append(view)
            main = count - count % _ROWS
            if main:
                self._reads.append((view[:main].view(_ROWS, -1), self._partial))
            if count - main:
                self._reads.append((view[main:], self._out))
            self._needed.append((source.storage, elements * _ELEMENT))
            remaining -= count
        self.read_bytes = sum(v.numel() for v in self._views) * _ELEMENT
        self._launches: list[Callable[[], None]] = []
        self.kernel: Literal["triton", "torch"] = "torch"
        self.kernel_note = "asked for torch's reduction" if kernel == "torch" else ""
        if kernel == "auto" and self._views:
            launches, why = triton_reads(self._views, self._partial)
            if launches is None:
                self.kernel_note = why
                log.debug("flare_l2evict: %s; the eviction reads with torch's reduction", why)
            else:
                self._launches, self.kernel = launches, "triton"

    def views(self) -> tuple[torch.Tensor, ...]:
        """The 1-d float32 views read, one per storage, largest first (empty once released)."""
        return tuple(self._views)

    @property
    def released(self) -> bool:
        return not self._views

    def _intact(self) -> bool:
        return bool(self._views) and all(s.nbytes() >= n for s, n in self._needed)

    def __call__(self) -> None:
        if self._fallback is None and self._intact():
            for launch in self._launches:
                launch()
            if not self._launches:
                for source, out in self._reads:
                    torch.sum(source, dim=-1, out=out)
            return
        self._stock()()

    def _stock(self) -> Callable[[], None]:
        if self._fallback is None:
            why = "released" if self.released else "its source storage shrank or was freed"
            log.warning(
                "flare_l2evict: eviction over %r on %s is %s; this race falls back to "
                "stock b12x's own buffer",
                self.source_name,
                self.device,
                why,
            )
            made = self._fallback_factory() if self._fallback_factory else None
            self._fallback = made if made is not None else _no_eviction
            self.release()
        return self._fallback

    def checksum(self) -> float:
        """The sum of the last call's outputs (synchronises; for tests, not races)."""
        return float(self._partial.sum().item() + self._out.item())

    def release(self) -> None:
        """Drop every reference to the weights. Idempotent."""
        self._views = []
        self._reads = []
        self._launches = []  # they hold views of the weights too
        self._needed = []

    def __repr__(self) -> str:
        state = "released" if self.released else f"{self.read_bytes:,} bytes"
        return f"WeightEviction({self.source_name!r} on {self.device}, {state}, {self.kernel})"


def _no_eviction() -> None:
    """Used only when no stock eviction can be made (no CUDA device)."""
