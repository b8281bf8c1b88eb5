"""The KV credit, computed here alone, and the byte figures it rests on (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

WORD = 4
"""Bytes of one float32, the element both stock b12x and the plugin read."""

_FLOOR_BYTES = 64 << 20


def stock_window_bytes(l2_cache_bytes: int) -> int:
    """``max(2 x L2, 64 MiB)``: the bytes stock b12x's eviction is asked to read per sample."""
    return max(2 * int(l2_cache_bytes), _FLOOR_BYTES)


def stock_buffer_bytes(l2_cache_bytes: int) -> int:
    """Bytes of the float32 buffer stock b12x allocates, and reads, per race job.

    Its 0-d output is left out (the plugin allocates one too): the credit stays a lower bound.
    """
    return -(-stock_window_bytes(l2_cache_bytes) // WORD) * WORD


OUTPUT_ROWS = 8192
"""Partial sums the eviction reduces into: enough rows that torch needs no temporary."""

_GRANULE = 512  # allocation granularity of torch's CUDA caching allocator

EVICTION_OUTPUT_BYTES = -(-OUTPUT_ROWS * WORD // _GRANULE) * _GRANULE + _GRANULE
"""Device bytes one eviction holds for its outputs, in allocator blocks."""
READ_KERNEL_BYTES = 2 << 20
"""Device memory charged for the read kernel's code: one 2 MiB driver page."""
CREDIT_OVERHEAD_BYTES = EVICTION_OUTPUT_BYTES + READ_KERNEL_BYTES
"""What the credit subtracts, once per process: the eviction's outputs and its kernel's code."""


@dataclass(frozen=True)
class Credit:
    """Bytes the KV allocator may add, and why they are 0 when they are."""

    nbytes: int
    reason: str | None = None
    uncut_bytes: int | None = None
    """What the credit was before :func:`credit` cut it to the memory free on the device
    (``None``: it was not cut)."""


def credit(
    *,
    installable: bool,
    race_jobs: int,
    stock_buffer_bytes: int,
    window_bytes: int,
    read_bytes: int,
    overhead_bytes: int = CREDIT_OVERHEAD_BYTES,
    free_bytes: int | None = None,
    race_jobs_from: str = "runtime.race_jobs",
) -> Credit:
    """What this rank may credit: stock's buffers for the jobs that will read the weights.

    Invariants the KV allocator relies on (checked by property tests):

    * ``0 <= nbytes <= race_jobs * stock_buffer_bytes``;
    * ``nbytes <= free_bytes`` when it is given: never more than the memory that could back
      it (the credit is cut to it, and ``uncut_bytes`` says from what);
    * ``nbytes == 0`` unless the eviction can be installed and reads at least
      the ``window_bytes`` it claims (``read_bytes >= window_bytes > 0``);
    * the eviction's own outputs and its read kernel's code (``overhead_bytes``, once per process)
      are subtracted, so the figure is a lower bound of what the races stop allocating.

    ``stock_buffer_bytes`` is what stock b12x allocates per job on this device, measured
    (:mod:`~._b12x.proof`); ``free_bytes`` what is free to torch there (``None`` off CUDA);
    ``race_jobs_from`` where the caller's race jobs come from, for the fix of 0 (a flag).
    """
    if not installable:
        return Credit(0, "nothing installed")
    if race_jobs <= 0:
        return Credit(
            0,
            f"nothing to reclaim: the host runs {race_jobs} race jobs; fix: pass "
            f"{race_jobs_from}, the b12x race jobs this process holds at once",
        )
    if stock_buffer_bytes <= 0:
        return Credit(0, "stock b12x allocated nothing for its eviction on this device")
    if window_bytes <= 0 or read_bytes < window_bytes:
        claims = f"{window_bytes:,}-byte window it claims"
        return Credit(0, f"the eviction reads {read_bytes:,} of the {claims}")
    saved = race_jobs * stock_buffer_bytes - overhead_bytes
    if saved <= 0:
        return Credit(0, f"the eviction's own {overhead_bytes:,} bytes outweigh what it saves")
    if free_bytes is None or saved <= free_bytes:
        return Credit(saved)
    # Past what is free: stock's buffers for that many jobs could not all exist either.
    if free_bytes <= 0:
        return Credit(0, f"no memory is free on the device to back {saved:,} bytes", saved)
    return Credit(free_bytes, None, saved)
