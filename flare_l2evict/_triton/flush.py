"""The plugin's two driver methods: evict by reading the weights, then leave the L2 dirty.

Stock's flush zeroes 256 MiB made once per ``do_bench`` call. Its end state, an L2
full of dirty lines whose write-back lands inside the timed kernel, is what keeps stock's
choices, and a read alone leaves clean lines (the choices move). So a served flush is two
steps: the eviction window read through the start-up's :class:`WeightEviction` (no memory),
then a scratch of about one L2 zeroed, the scratch made per ``do_bench`` call as stock's
buffer is: nothing is held between calls but the token that call holds.

CUDA graphs: :meth:`FlushToken.clear` allocates nothing and never synchronises, so it
can be captured (``do_bench_cudagraph_proton`` captures its flushes), and it keeps
stock's two steps there too. A graph replays the read without the eviction's per-read
check, so a token that was captured pins the storages it read (the eviction's views)
for as long as it lives: a graph replayed after the start-up reads memory that is still
allocated, never weights the host has since freed. Stock's captured flush asks the same
of its host (its buffer must outlive the graph that writes it); the token is that buffer.
Outside a capture the eviction checks, before every read, that the weights are where they
were (its own guarantee), and once it is released the token writes its scratch alone.

Passive: nothing here imports the start-up or calls back into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .. import _counting
from .._eviction import WeightEviction
from .proof import MARK

WORD = 4
"""Bytes of one int32 word of the scratch, as stock's buffer is made of."""


@dataclass
class Counts:
    """What the ``do_bench`` calls asked of the seam while installed: a report section's fields.

    ``*_bytes`` are the most one ``do_bench`` call allocated for its flush (stock's driver:
    268,435,456 on every GPU): the scratch for the calls served, what the driver's own method
    returned for the others.
    """

    calls: int = 0
    """``do_bench`` calls whose flush buffer the plugin made (one scratch each)."""
    flushes: int = 0
    """Flushes served: the window read, then the scratch zeroed."""
    captured: int = 0
    """Of ``flushes``, those captured into a CUDA graph (their token pins what they read)."""
    scratch_only: int = 0
    """Flushes on a plugin token that wrote the scratch alone: its eviction was released."""
    scratch_bytes: int = 0
    stock_calls: int = 0
    """``do_bench`` calls left to the driver's own method (another device, or released)."""
    stock_bytes: int = 0
    stock_flushes: int = 0
    """Flushes of a buffer the plugin did not make, left to the driver's own method."""


def copied(counts: Counts) -> Counts:
    """A copy of ``counts`` for an audit, read without the lock: a signal handler that ends the
    start-up may run on a thread that holds it, inside a flush's count (the sweeps of
    tests/test_every_line.py found that wait). Each field is read whole; a flush counted while
    the copy is made may show in one field and not yet in another."""
    return replace(counts)


def scratch_bytes(l2_cache_bytes: int, factor: float = 1.0) -> int:
    """The scratch for an L2 of ``l2_cache_bytes``: ``factor`` x L2 in whole words, at least one."""
    if l2_cache_bytes <= 0 or not factor > 0:
        raise ValueError(
            f"a scratch of {factor} x an L2 of {l2_cache_bytes:,} bytes: both must be positive"
        )
    return max(WORD, int(l2_cache_bytes * factor) // WORD * WORD)


def stored_bytes(made: object) -> int:
    """Bytes of the storage a driver's flush buffer holds (0: not a tensor)."""
    if isinstance(made, torch.Tensor):
        return int(made.untyped_storage().nbytes())
    return 0


def _capturing(device: torch.device) -> bool:
    """Whether this thread's current CUDA stream is capturing a graph (a flag read, no sync)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class FlushToken:
    """What the plugin's ``get_empty_cache_for_benchmark`` hands one ``do_bench`` call: that
    call's scratch and the eviction it reads. ``do_bench`` only passes it back to ``clear_cache``.
    """

    __slots__ = ("counts", "eviction", "pinned", "scratch")

    def __init__(self, eviction: WeightEviction, scratch: torch.Tensor, counts: Counts) -> None:
        self.eviction, self.scratch, self.counts = eviction, scratch, counts
        self.pinned: tuple[torch.Tensor, ...] = ()
        """The views read, once a flush was captured: their storages live as long as this."""

    def clear(self) -> None:
        """Read the window, then zero the scratch (the scratch alone once the eviction is
        released). Allocates nothing, never synchronises; pins what it reads when captured."""
        if self.eviction.released:
            self.scratch.zero_()
            with _counting.lock:
                self.counts.scratch_only += 1
            return
        captured = _capturing(self.scratch.device)
        if captured and not self.pinned:
            self.pinned = self.eviction.views()  # before the read: a replay reads these
        self.eviction()
        self.scratch.zero_()  # a write, as stock's: the L2 is left dirty
        with _counting.lock:
            self.counts.flushes += 1
            self.counts.captured += captured

    def zero_(self) -> None:
        """Stock's ``clear_cache(cache)`` is ``cache.zero_()``: a token that outlives the
        installation (a ``do_bench`` across the undo) is then zeroed, never its weights read."""
        self.scratch.zero_()

    def __repr__(self) -> str:
        return f"FlushToken({stored_bytes(self.scratch):,} bytes, {self.eviction!r})"


def _current_device(kind: str) -> torch.device:
    """The device a stock flush buffer would be made on: CUDA's current device."""
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(kind)


def _home(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def flush_methods(
    eviction: WeightEviction,
    originals: dict[str, Callable[..., object]],
    scratch: int,
    counts: Counts,
    device_now: Callable[[str], torch.device] = _current_device,
) -> dict[str, Callable[..., object]]:
    """The two replacement methods, by name, to set on one driver instance (so they take no
    ``self``). ``originals``: that instance's own methods before the change, for what the plugin
    does not serve; ``scratch``: bytes per ``do_bench`` call; ``device_now``: the device a stock
    buffer of that kind would be made on now."""
    home, words = _home(eviction.device), scratch // WORD
    make, clear = originals["get_empty_cache_for_benchmark"], originals["clear_cache"]

    def get_empty_cache_for_benchmark() -> object:
        if eviction.released or device_now(home.type) != home:
            made = make()
            with _counting.lock:
                counts.stock_calls += 1
                counts.stock_bytes = max(counts.stock_bytes, stored_bytes(made))
            return made
        token = FlushToken(eviction, torch.empty(words, dtype=torch.int32, device=home), counts)
        with _counting.lock:
            counts.calls += 1
            counts.scratch_bytes = max(counts.scratch_bytes, words * WORD)
        return token

    def clear_cache(cache: object) -> None:
        if type(cache) is FlushToken:  # made by any installation of the plugin
            cache.clear()
            return
        with _counting.lock:
            counts.stock_flushes += 1
        clear(cache)

    for replacement, original in ((get_empty_cache_for_benchmark, make), (clear_cache, clear)):
        setattr(replacement, MARK, True)
        setattr(replacement, "__wrapped__", original)  # noqa: B010 (a union of two signatures)
    return {
        "get_empty_cache_for_benchmark": get_empty_cache_for_benchmark,
        "clear_cache": clear_cache,
    }
