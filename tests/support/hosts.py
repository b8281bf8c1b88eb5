"""One home for the tests' host: the plugin manager, a CPU runtime, its weights, the seam.

The figures are stated once: on a CPU reference runtime with an L2 of ``L2``, stock b12x's
window is ``max(2 x L2, 64 MiB)`` = 64 MiB per race job, so ``JOBS`` race jobs credit
``CREDIT`` (the eviction's own outputs and kernel code, ``OWN``, subtracted once).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

from flare_l2evict import ReclaimReport, StartupAudit
from flare_l2evict._b12x.proof import MARK
from flare_l2evict.tools._origin import stock_row
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator,
    ReferenceRuntime,
    plugin_manager,
)
from support.figures import OWN, MiB

L2 = 8 * MiB
JOBS = 3
STOCK_BUFFER = 64 * MiB
CREDIT = JOBS * STOCK_BUFFER - OWN
WEIGHT = "model.layers.0.mlp.experts.w13_weight"
PM = plugin_manager(["l2evict"])
_WEIGHTS: Any = object()  # runtime()'s default tensors: weights(nbytes); None is a host's value


def measurement() -> Any:
    """The module of the loaded b12x that holds stock's eviction (the seam)."""
    return importlib.import_module(stock_row().module_path)


def seam() -> object:
    """What b12x's races call for their eviction now."""
    return getattr(measurement(), stock_row().function)


def stock_seam() -> object:
    """Stock b12x's own eviction function, found under the plugin's replacement if bound."""
    return _stock_of(measurement())


@functools.cache
def _stock_of(module: Any) -> object:
    # Kept per module object from its first look, so a later look cannot mistake a
    # stranger's function bound there for stock's.
    found = getattr(module, stock_row().function)
    while getattr(found, MARK, False):
        found = found.__wrapped__  # each replacement of the plugin's wraps what it replaced
    return found


try:  # kept at collection, before any test can bind a stand-in there
    stock_seam()
except ImportError:
    pass  # no b12x here: the tests that need its seam skip


def seam_is_ours() -> bool:
    """Whether b12x's races read the plugin's eviction.

    ``True`` only for the plugin's replacement, ``False`` only for stock's own
    function; anything else bound there fails the calling test.
    """
    found = seam()
    if getattr(found, MARK, False):
        return True
    assert found is stock_seam(), f"neither stock's eviction nor the plugin's is bound: {found!r}"
    return False


def weights(nbytes: int = 64 * MiB) -> dict[str, torch.Tensor]:
    """One resident expert weight of ``nbytes`` on the CPU.

    Uninitialised, as test_every_line.py's are: no race reads it on the CPU, and zeroing
    64 MiB costs a quarter of a second of page faults on a small VM, per test.
    """
    return {WEIGHT: torch.empty(nbytes // 4)}


def runtime(
    nbytes: int = 64 * MiB,
    *,
    tensors: Any = _WEIGHTS,
    config: dict[str, Any] | None = None,
    allocator: Any = None,
    race_jobs: int = JOBS,
    device: str | torch.device = "cpu",
    l2_cache_bytes: int | None = L2,
    kind: type[ReferenceRuntime] = ReferenceRuntime,
    **more: Any,
) -> ReferenceRuntime:
    """The reference host's runtime on the CPU, around ``tensors`` (default :func:`weights`).

    On a GPU, ``l2_cache_bytes=None`` has the plugin read the device's own L2 size.
    """
    return kind(
        device=torch.device(device),
        config=config or {},
        kv_allocator=allocator or ReferenceKVAllocator(1024),
        race_jobs=race_jobs,
        l2_cache_bytes=l2_cache_bytes,
        tensors=weights(nbytes) if tensors is _WEIGHTS else tensors,
        **more,
    )


def hook(of: Any) -> ReclaimReport:
    """``before_first_capture(runtime=of)`` through real pluggy; the plugin's report."""
    report: ReclaimReport
    (report,) = PM.hook.before_first_capture(runtime=of)
    return report


def complete(of: Any) -> StartupAudit:
    """``startup_complete(runtime=of)`` through real pluggy; the plugin's audit."""
    audit: StartupAudit
    (audit,) = PM.hook.startup_complete(runtime=of)
    return audit


class WitnessAllocatorStandIn(ReferenceKVAllocator):
    """Notes whether the seam was the plugin's when the credit was applied."""

    backed: bool | None = None

    def add_reclaimed(self, report: ReclaimReport) -> None:
        self.backed = seam_is_ours()
        super().add_reclaimed(report)
