"""A hostile host: a runtime whose attributes can raise, an allocator with a chosen misbehaviour.

The host's runtime and allocator are code the plugin does not own, so these stand in for
them (named so); ``test_host_values.py`` and ``test_host_calls.py`` put them through real
pluggy, the real plugin, b12x's real seam and torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from flare_l2evict import ReclaimReport
from support.hosts import JOBS, L2, PM, weights


@dataclass
class HostileRuntimeStandIn:
    """A host runtime that can misbehave: raising properties.

    ``raising`` names the attribute whose read raises; ``tensors`` is whatever
    ``resident_tensors()`` returns.
    """

    kv_allocator: Any
    tensors: Any
    config: Any = field(default_factory=dict)
    raising: str | None = None
    rank_: Any = 0
    world_size_: Any = 1
    race_jobs_: Any = JOBS

    def _read(self, name: str, value: Any) -> Any:
        if self.raising == name:
            raise RuntimeError(f"host property {name} exploded")
        return value

    device = property(lambda self: self._read("device", torch.device("cpu")))
    rank = property(lambda self: self._read("rank", self.rank_))
    world_size = property(lambda self: self._read("world_size", self.world_size_))
    process_group = property(lambda self: self._read("process_group", None))
    race_jobs = property(lambda self: self._read("race_jobs", self.race_jobs_))
    l2_cache_bytes = property(lambda self: self._read("l2_cache_bytes", L2))
    kv_sizing = property(lambda self: self._read("kv_sizing", None))

    def __getattribute__(self, name: str) -> Any:
        if name in ("kv_allocator", "config") and object.__getattribute__(self, "raising") == name:
            raise RuntimeError(f"host property {name} exploded")
        if name == "resident_tensors" and object.__getattribute__(self, "raising") == name:
            raise RuntimeError("host property resident_tensors exploded")
        return object.__getattribute__(self, name)

    def resident_tensors(self) -> Any:
        return self.tensors


class HostileAllocatorStandIn:
    """A host KV allocator with a chosen misbehaviour.

    ``mode``: ``ok``; ``raise-before`` (refuses, applies nothing);
    ``apply-then-raise``; ``re-enter`` (calls the hook again from inside);
    ``keyboard`` (applies, then KeyboardInterrupt); ``exit`` (SystemExit).
    ``applied`` is what it really added to its budget.
    """

    def __init__(self, mode: str = "ok", pm: Any = None, runtime: Any = None) -> None:
        self.mode, self.pm, self.runtime = mode, pm, runtime
        self.applied = 0
        self.inner: list[ReclaimReport] = []

    def add_reclaimed(self, report: ReclaimReport) -> None:
        if self.mode == "raise-before":
            raise RuntimeError("allocator refused")
        self.applied += report.reclaimed_bytes
        if self.mode == "apply-then-raise":
            raise RuntimeError("allocator applied, then failed")
        if self.mode == "re-enter":
            self.inner.extend(self.pm.hook.before_first_capture(runtime=self.runtime))
        if self.mode == "keyboard":
            raise KeyboardInterrupt
        if self.mode == "exit":
            raise SystemExit(3)


_WEIGHTS = object()


def hostile(mode: str = "ok", tensors: Any = _WEIGHTS, **kwargs: Any) -> HostileRuntimeStandIn:
    """The shared host (support.hosts: its PM, weights(), L2 and JOBS) with a hostile shape."""
    allocator = HostileAllocatorStandIn(mode, PM)
    runtime = HostileRuntimeStandIn(
        allocator, weights() if tensors is _WEIGHTS else tensors, **kwargs
    )
    allocator.runtime = runtime
    return runtime


def aliases(count: int, nbytes: int) -> dict[str, torch.Tensor]:
    """``count`` distinct storage objects over one allocation (storage slices), and its owner.

    The slices borrow the owner's memory and are never read themselves
    (tests/test_weights.py); the owner's tensor covers the same bytes.
    """
    base = torch.zeros(nbytes // 4).untyped_storage()
    slices = {
        f"alias.{i}": torch.empty(0).set_(base[0:nbytes], 0, (nbytes // 4,), (1,))
        for i in range(count)
    }
    return {"owner": torch.empty(0).set_(base), **slices}
