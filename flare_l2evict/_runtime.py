"""Read the host's ``runtime`` once, against the contract in :mod:`flare_l2evict.hookspec`."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ._errors import RuntimeContractError

MAX_RACE_JOBS = 1024
"""More concurrent race jobs than any b12x start-up holds; above it the value is a host bug."""

MAX_L2_BYTES = 1 << 32
"""4 GiB: far above any GPU's L2 (128 MiB on GB202); above it the value is a host bug."""

_CONTRACT = "see flare_l2evict.FlareRuntime"


@dataclass(frozen=True)
class Placement:
    """Where this process sits, read leniently so even a faulty runtime gets a valid report.

    ``rank``/``world_size`` fall back to 0/1 and ``device`` to the text the
    host gave when those attributes are missing or out of range; the strict
    reading is :func:`read_runtime`.
    """

    device: str
    rank: int
    world_size: int
    process_group: object | None


@dataclass(frozen=True)
class RuntimeFacts:
    """The runtime's attributes, checked: what every later step may rely on.

    Invariants: ``device`` is a ``torch.device`` of type ``cpu`` or ``cuda``;
    ``0 <= rank < world_size``; ``race_jobs`` in ``0..MAX_RACE_JOBS``;
    ``l2_cache_bytes`` is ``None`` (read from the CUDA device later) or in
    ``1..MAX_L2_BYTES``; ``add_reclaimed`` and ``resident_tensors`` are callable.
    """

    device: torch.device
    rank: int
    world_size: int
    process_group: object | None
    config: Mapping[str, Any]
    race_jobs: int
    l2_cache_bytes: int | None
    add_reclaimed: Callable[[Any], object]
    resident_tensors: Callable[[], Mapping[str, torch.Tensor]]


def _whole(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _device(value: object) -> torch.device | None:
    if isinstance(value, torch.device):
        device = value
    elif isinstance(value, str):
        try:
            device = torch.device(value)
        except (RuntimeError, ValueError):
            return None
    else:
        return None
    return device if device.type in ("cpu", "cuda") else None


def placement(runtime: object) -> Placement:
    """What a report needs to name this process, whatever the host passed."""
    device = _device(getattr(runtime, "device", None))
    rank = _whole(getattr(runtime, "rank", 0))
    world = _whole(getattr(runtime, "world_size", 1))
    if rank is None or world is None or not 0 <= rank < world:
        rank, world = 0, 1
    shown = str(device) if device is not None else repr(getattr(runtime, "device", None))[:40]
    return Placement(shown, rank, world, getattr(runtime, "process_group", None))


def read_runtime(runtime: object) -> RuntimeFacts:
    """The checked runtime, or :class:`RuntimeContractError` naming the first bad attribute.

    The message is one line: the attribute, what it was, and what it accepts.
    """

    def bad(name: str, accepts: str) -> RuntimeContractError:
        if not hasattr(runtime, name):
            got = "missing"
        else:
            got = f"= {getattr(runtime, name)!r}"[:80]
        return RuntimeContractError(
            f"runtime.{name} {got}: the host must pass {accepts} ({_CONTRACT})"
        )

    device = _device(getattr(runtime, "device", None))
    if device is None:
        raise bad("device", "a torch.device of type cuda (or cpu on the reference host)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise bad("device", "a device this process can use (CUDA is not available here)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise bad("device", f"a CUDA device in 0..{torch.cuda.device_count() - 1}")
    world = _whole(getattr(runtime, "world_size", None))
    if world is None or world < 1:
        raise bad("world_size", "a whole number >= 1")
    rank = _whole(getattr(runtime, "rank", None))
    if rank is None or not 0 <= rank < world:
        raise bad("rank", f"a whole number in 0..{world - 1} (below world_size {world})")
    group = getattr(runtime, "process_group", None)
    if world > 1 and group is None:
        raise bad("process_group", "the tensor-parallel process group when world_size > 1")
    config = getattr(runtime, "config", None)
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise bad("config", "the deployment config as a mapping")
    jobs = _whole(getattr(runtime, "race_jobs", None))
    if jobs is None or not 0 <= jobs <= MAX_RACE_JOBS:
        raise bad("race_jobs", f"a whole number in 0..{MAX_RACE_JOBS}")
    l2_value = getattr(runtime, "l2_cache_bytes", None)
    l2 = None if l2_value is None else _whole(l2_value)
    if l2_value is not None and (l2 is None or not 0 < l2 <= MAX_L2_BYTES):
        raise bad("l2_cache_bytes", f"None or a whole number of bytes in 1..{MAX_L2_BYTES:,}")
    if l2 is None and device.type != "cuda":
        raise bad("l2_cache_bytes", f"the L2 size in bytes on a {device.type} device")
    allocator = getattr(runtime, "kv_allocator", None)
    add = getattr(allocator, "add_reclaimed", None)
    if not callable(add):
        raise bad("kv_allocator", "an object with add_reclaimed(report)")
    tensors = getattr(runtime, "resident_tensors", None)
    if not callable(tensors):
        raise bad("resident_tensors", "a method returning the resident tensors by name")
    return RuntimeFacts(device, rank, world, group, config, jobs, l2, add, tensors)
