"""The eviction callable: a read-only pass over a window of resident weights."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ._source import SourceChoice

log = logging.getLogger("flare_l2evict.eviction")

_ELEMENT = 4  # bytes of float32, the dtype stock b12x reduces over


class WeightEviction:
    """Displace L2 by reading the tail of the chosen storages; write nothing to them.

    Invariants a caller relies on:

    * a call allocates no memory and does not synchronise with the host, so it
      can sit before every timed sample and be captured in a CUDA graph;
    * the only memory written is a 0-d float32 output owned by this object,
      so calls from several race jobs may interleave;
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
    ) -> None:
        self.window_bytes = choice.window_bytes
        self.device = choice.device
        self.source_name = choice.name
        self._fallback_factory = fallback
        self._fallback: Callable[[], None] | None = None
        self._views: list[torch.Tensor] = []
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
            view.set_(source.storage, elements - count, (count,))
            self._views.append(view)
            self._needed.append((source.storage, elements * _ELEMENT))
            remaining -= count
        self.read_bytes = sum(v.numel() for v in self._views) * _ELEMENT
        self._out = torch.empty((), dtype=torch.float32, device=self.device)

    @property
    def released(self) -> bool:
        return not self._views

    def _intact(self) -> bool:
        return bool(self._views) and all(s.nbytes() >= n for s, n in self._needed)

    def __call__(self) -> None:
        if self._fallback is None and self._intact():
            for view in self._views:
                torch.sum(view, dim=0, out=self._out)
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

    def release(self) -> None:
        """Drop every reference to the weights. Idempotent."""
        self._views = []
        self._needed = []

    def __repr__(self) -> str:
        state = "released" if self.released else f"{self.read_bytes:,} bytes"
        return f"WeightEviction({self.source_name!r} on {self.device}, {state})"


def _no_eviction() -> None:
    """Used only when no stock eviction can be made (no CUDA device)."""
