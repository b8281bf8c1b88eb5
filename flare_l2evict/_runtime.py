"""Read the host's ``runtime`` once, defensively, against the contract in :mod:`.hookspecs`.

Any attribute may be a property that raises: each is read exactly once (:func:`snapshot`), what
reading it raised kept as a fact, so no host behaviour escapes the hook's fallback guard.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ._errors import RuntimeContractError
from ._text import described, described_value
from .hookspecs import RUNTIME_ATTRIBUTES

MAX_RACE_JOBS = 1024
"""More concurrent race jobs than any b12x start-up holds; above it the value is a host bug."""

MAX_L2_BYTES = 1 << 32
"""4 GiB: far above any GPU's L2 (128 MiB on GB202); above it the value is a host bug."""

_CONTRACT = "see flare_l2evict.FlareRuntime"
_MISSING = object()


@dataclass(frozen=True)
class Placement:
    """Where this process sits, read leniently (:func:`placement`): valid from any runtime."""

    device: str
    rank: int
    world_size: int
    process_group: object | None


@dataclass(frozen=True)
class RuntimeFacts:
    """What :func:`read_runtime` checked and the core reads.

    ``device`` is ``cpu`` or ``cuda``; ``race_jobs`` in ``0..MAX_RACE_JOBS``; ``l2_cache_bytes``
    ``None`` (read from CUDA) or in ``1..MAX_L2_BYTES``; ``add_reclaimed`` not ``async``.
    """

    device: torch.device
    race_jobs: int
    l2_cache_bytes: int | None
    add_reclaimed: Callable[[Any], object]
    resident_tensors: Callable[[], object]


@dataclass(frozen=True)
class Snapshot:
    """Each contract attribute of ``runtime`` as read once: its value, or why it could not be."""

    values: dict[str, object]
    errors: dict[str, str]
    add_reclaimed: Callable[[Any], object] | None

    def get(self, name: str) -> object:
        """The attribute's value; ``None`` when it is missing or reading it raised."""
        found = self.values.get(name, _MISSING)
        return None if found is _MISSING else found

    def bad(self, name: str, accepts: str) -> RuntimeContractError:
        value = self.values[name]
        if name in self.errors:
            got = f"raised {self.errors[name]}"
        elif value is _MISSING:
            got = "missing"
        else:
            got = "= " + described_value(value, 80)
        return RuntimeContractError(
            f"runtime.{name} {got}: the host must pass {accepts} ({_CONTRACT})"
        )

    def device(self) -> torch.device:
        device = _device(self.get("device"))
        if device is None:
            raise self.bad("device", "a torch.device of type cuda (or cpu on the reference host)")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise self.bad(
                    "device", "a device this process can use (CUDA is not available here)"
                )
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise self.bad("device", f"a CUDA device in 0..{torch.cuda.device_count() - 1}")
        return device

    def topology(self) -> None:
        """``rank`` and ``world_size`` checked, and the ``process_group`` against both."""
        world = whole_number(self.get("world_size"))
        if world is None or world < 1:
            raise self.bad("world_size", "a whole number >= 1")
        rank = whole_number(self.get("rank"))
        if rank is None or not 0 <= rank < world:
            raise self.bad("rank", f"a whole number in 0..{world - 1} (below world_size {world})")
        group = self.get("process_group")
        if world > 1 and group is None:
            raise self.bad("process_group", "the tensor-parallel process group when world_size > 1")
        if group is not None:
            _check_group(group, rank, world)

    def l2_cache_bytes(self, device: torch.device) -> int | None:
        l2_value = self.get("l2_cache_bytes")
        l2 = None if l2_value is None else whole_number(l2_value)
        if l2_value is not None and (l2 is None or not 0 < l2 <= MAX_L2_BYTES):
            raise self.bad(
                "l2_cache_bytes", f"None or a whole number of bytes in 1..{MAX_L2_BYTES:,}"
            )
        if l2 is None and device.type != "cuda":
            raise self.bad("l2_cache_bytes", f"the L2 size in bytes on a {device.type} device")
        return l2


def snapshot(runtime: object) -> Snapshot:
    """Read every contract attribute of ``runtime`` once; never raises an ``Exception``."""
    values: dict[str, object] = {}
    errors: dict[str, str] = {}
    for name in RUNTIME_ATTRIBUTES:
        try:
            values[name] = getattr(runtime, name, _MISSING)
        except Exception as error:  # a property of the host's that raises
            values[name] = _MISSING
            errors[name] = described(error, 200)
    add: Callable[[Any], object] | None = None
    try:  # None when kv_allocator is missing or None
        found = getattr(values["kv_allocator"], "add_reclaimed", None)
    except Exception as error:
        errors["kv_allocator"] = f"reading add_reclaimed raised {described(error, 200)}"
    else:
        add = found if callable(found) else None
    return Snapshot(values, errors, add)


def whole_number(value: object) -> int | None:
    try:  # isinstance itself reads __class__, which a host's object may make raise
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return None
        whole = int(value)
    except Exception:  # an Integral of the host's whose __int__ raises
        return None
    return whole if type(whole) is int else None


def _device(value: object) -> torch.device | None:
    try:
        if type(value) is torch.device:
            device = value
        elif isinstance(value, str):
            device = torch.device(str.__str__(value))
        else:
            return None
    except Exception:  # not a device torch knows, or a str subclass of the host's
        return None
    return device if device.type in ("cpu", "cuda") else None


def placement(seen: Snapshot) -> Placement:
    """What a report needs to name this process, whatever the host passed; never raises."""
    group = seen.get("process_group")

    def lenient(name: str, absent: int) -> int | None:
        raw = seen.values[name]
        if name in seen.errors:
            return None
        return absent if raw is _MISSING else whole_number(raw)

    try:
        rank, world = lenient("rank", 0), lenient("world_size", 1)
        if rank is None or world is None or not 0 <= rank < world:
            rank, world = 0, 1
        raw_device = seen.values["device"]
        device = _device(raw_device)
        if device is not None:
            where = str(device)
        elif raw_device is _MISSING:
            where = "unknown device"
        else:
            where = described_value(raw_device, 40)
    except Exception:
        return Placement("unknown device", 0, 1, group)
    return Placement(where, rank, world, group)


def read_runtime(seen: Snapshot) -> RuntimeFacts:
    """The checked runtime, or :class:`RuntimeContractError` naming the first bad attribute."""
    for name in RUNTIME_ATTRIBUTES:
        if name in seen.errors and name != "kv_allocator":
            raise seen.bad(name, "an attribute that can be read")
    device = seen.device()
    seen.topology()
    config = seen.get("config")
    if config is not None and not isinstance(config, Mapping):
        raise seen.bad("config", "the deployment config as a mapping")
    jobs = whole_number(seen.get("race_jobs"))
    if jobs is None or not 0 <= jobs <= MAX_RACE_JOBS:
        raise seen.bad("race_jobs", f"a whole number in 0..{MAX_RACE_JOBS}")
    l2 = seen.l2_cache_bytes(device)
    add = seen.add_reclaimed
    if "kv_allocator" in seen.errors or add is None:
        raise seen.bad("kv_allocator", "an object with add_reclaimed(report)")
    tensors = seen.get("resident_tensors")
    if not callable(tensors):
        raise seen.bad("resident_tensors", "a method returning the resident tensors by name")
    call = getattr(type(add), "__call__", None)  # noqa: B004  # the class's, for callable objects
    if inspect.iscoroutinefunction(add) or (
        not inspect.isroutine(add) and inspect.iscoroutinefunction(call)
    ):  # an async def add_reclaimed would never run: refused before anything is offered
        raise RuntimeContractError(
            "runtime.kv_allocator.add_reclaimed is a coroutine function (async def): the plugin "
            "calls it synchronously, so its credit would never be applied; fix: make "
            "add_reclaimed a plain function that grows the KV budget before returning"
        )
    return RuntimeFacts(device, jobs, l2, add, tensors)


def _check_group(group: object, rank: int, world: int) -> None:
    """The group must hold exactly ``world`` ranks, with this process at ``rank``."""
    import torch.distributed as dist

    where = "runtime.process_group"
    try:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("torch.distributed is not initialized")
        size = dist.get_world_size(group)  # type: ignore[arg-type]
        mine = dist.get_rank(group)  # type: ignore[arg-type]
    except Exception as error:
        raise RuntimeContractError(
            f"{where} cannot be used ({described(error, 200)}): the host must pass its initialised "
            f"tensor-parallel group ({_CONTRACT})"
        ) from None
    if size != world or mine != rank:
        raise RuntimeContractError(
            f"{where} has {size} ranks with this process at rank {mine}, but runtime.world_size "
            f"= {world} and runtime.rank = {rank}: the host must pass the group whose ranks "
            f"size the KV cache alike ({_CONTRACT})"
        )


def read_tensors(facts: RuntimeFacts) -> Mapping[str, torch.Tensor]:
    """``resident_tensors()``, called once, checked to be a mapping; bounded time whatever it is."""
    try:
        found = facts.resident_tensors()
    except Exception as error:
        raise RuntimeContractError(
            f"runtime.resident_tensors() raised {described(error, 200)}: the host must return the "
            f"loaded checkpoint tensors by name ({_CONTRACT})"
        ) from None
    try:
        mapping = isinstance(found, Mapping)
    except Exception:
        mapping = False
    if not mapping:
        raise RuntimeContractError(
            f"runtime.resident_tensors() returned {_described(found)}, not a mapping of names "
            f"to tensors; fix: return {{name: tensor}} for the loaded checkpoint ({_CONTRACT})"
        )
    return found  # type: ignore[return-value]


def _described(value: object) -> str:
    """What a value is, in bounded time: never iterates a tensor's elements."""
    kind = type(value)  # never __class__, which a host object may answer
    try:
        if issubclass(kind, torch.Tensor):
            shape = tuple(torch.Tensor.size(value))  # type: ignore[call-overload]
            dtype = torch.Tensor.dtype.__get__(value)  # type: ignore[attr-defined]
            return f"a Tensor of shape {shape} ({dtype})"
        if kind in (list, tuple, set, frozenset, dict):
            return f"a {kind.__name__} of {len(value):,} items"  # type: ignore[arg-type]
    except Exception:  # a subclass of the host's whose shape or len raises
        pass
    return f"a {type(value).__name__}"
