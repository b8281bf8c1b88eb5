"""The KV credit: the one place the figure handed to the KV allocator is computed."""

from __future__ import annotations

from dataclasses import dataclass

from ._eviction import OWN_BYTES


@dataclass(frozen=True)
class Credit:
    """Bytes the KV allocator may add, and why they are 0 when they are."""

    nbytes: int
    reason: str | None = None


def credit(
    *,
    installed: bool,
    race_jobs: int,
    stock_buffer_bytes: int,
    window_bytes: int,
    read_bytes: int,
    own_bytes: int = OWN_BYTES,
) -> Credit:
    """What this rank may credit: stock's buffers for the jobs that will read the weights.

    Invariants the KV allocator relies on (checked by property tests):

    * ``0 <= nbytes <= race_jobs * stock_buffer_bytes``;
    * ``nbytes == 0`` unless the eviction is installed and reads at least
      the ``window_bytes`` it claims (``read_bytes >= window_bytes > 0``);
    * the eviction's own outputs and its read kernel's code (``own_bytes``,
      once per process) are subtracted, so the figure is a lower bound of what
      the races stop allocating.

    ``stock_buffer_bytes`` must be what stock b12x really allocates per job
    on this device (:func:`~flare_l2evict._seam.measure_stock_buffer`).
    """
    if not installed:
        return Credit(0, "nothing installed")
    if race_jobs <= 0:
        return Credit(
            0,
            f"nothing to reclaim: the host runs {race_jobs} race jobs; fix: pass "
            "runtime.race_jobs, the b12x race jobs this process holds at once",
        )
    if stock_buffer_bytes <= 0:
        return Credit(0, "stock b12x allocated nothing for its eviction on this device")
    if window_bytes <= 0 or read_bytes < window_bytes:
        return Credit(
            0,
            f"the eviction reads {read_bytes:,} of the {window_bytes:,}-byte window it claims; "
            "fix: set plugins.l2evict.window to a multiple of 4 bytes, or 'stock'",
        )
    saved = race_jobs * stock_buffer_bytes - own_bytes
    if saved <= 0:
        return Credit(0, f"the eviction's own {own_bytes:,} bytes outweigh what it saves")
    return Credit(saved)
