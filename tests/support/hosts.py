"""One home for the tests' host: the plugin manager, a CPU runtime, its weights, the seam.

The figures are stated once: on a CPU reference runtime with an L2 of ``L2``, stock b12x's
window is ``max(2 x L2, 64 MiB)`` = 64 MiB per race job, so ``JOBS`` race jobs credit
``CREDIT`` (the eviction's own outputs and kernel code, ``OWN``, subtracted once).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from flare_l2evict import ReclaimReport, StartupAudit
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


def measurement() -> Any:
    """The module of the loaded b12x that holds stock's eviction (the seam)."""
    return importlib.import_module(stock_row().module_path)


def seam() -> object:
    """What b12x's races call for their eviction now."""
    return getattr(measurement(), stock_row().function)


def seam_is_ours() -> bool:
    """Whether b12x's races read the plugin's eviction (the seam is replaced)."""
    return bool(getattr(seam(), "__flare_l2evict__", False))


def weights(nbytes: int = 64 * MiB) -> dict[str, torch.Tensor]:
    """One resident expert weight of ``nbytes`` on the CPU."""
    return {WEIGHT: torch.zeros(nbytes // 4)}


def runtime(
    nbytes: int = 64 * MiB,
    *,
    config: dict[str, Any] | None = None,
    allocator: Any = None,
    race_jobs: int = JOBS,
    kind: type[ReferenceRuntime] = ReferenceRuntime,
    **more: Any,
) -> ReferenceRuntime:
    """The reference host's runtime on the CPU, around :func:`weights`."""
    return kind(
        device=torch.device("cpu"),
        config=config or {},
        kv_allocator=allocator or ReferenceKVAllocator(1024),
        race_jobs=race_jobs,
        l2_cache_bytes=L2,
        tensors=weights(nbytes),
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
