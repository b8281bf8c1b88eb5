"""Read the host's ``runtime`` once, defensively, into the core's request (:func:`request_from`).

Any attribute may be a property that raises: each is read exactly once (:func:`snapshot`),
what reading it raised kept as a fact, so no host behaviour escapes as an exception. Nothing
here runs under the plugin's lock: the start-up has not begun when the host is read.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from . import _request
from ._errors import L2EvictError, RuntimeContractError
from ._report import HOST
from ._request import KVSizing, OutOfBounds, Placement, Refused, Request, whole_number
from ._settings import (
    SECTION,
    L2EvictSettings,
    on_error_raises,
    read_section,
    settings_from_section,
)
from ._text import described, described_value
from .hookspecs import RUNTIME_ATTRIBUTES

_CONTRACT = "see flare_l2evict.FlareRuntime"
_MISSING = object()


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
            got = "= " + described_value(value, 80) + _not_plain(value)
        return RuntimeContractError(
            f"runtime.{name} {got}: the host must pass {accepts} ({_CONTRACT})"
        )

    def checked(self, name: str, check: Callable[[object], Any]) -> Any:
        """``check`` of the attribute's value; :class:`OutOfBounds` becomes the host's line."""
        try:
            return check(self.get(name))
        except OutOfBounds as bounds:
            raise self.bad(name, bounds.accepts) from None

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


def _not_plain(value: object) -> str:
    """`` (a Kind, not a str)`` for a str subclass or str Enum: its text may be what the
    contract names (``'measured'``), and the line must not read as if that were refused."""
    kind = type(value)  # never __class__, which a host object may answer
    if kind is str or not issubclass(kind, str):
        return ""
    try:  # a metaclass of the host's may make even __name__ raise
        name = str.__str__(type.__dict__["__name__"].__get__(kind))
    except Exception:
        name = "str subclass"
    return f" (a {name}, not a str)"


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
        device = _request.device_named(raw_device)
        if device is not None:
            where = str(device)
        elif raw_device is _MISSING:
            where = "unknown device"
        else:
            where = described_value(raw_device, 40)
    except Exception:
        return Placement("unknown device", 0, 1, group)
    return Placement(where, rank, world, group)


def request_from(runtime: object) -> Request | Refused:
    """The core's request for ``runtime``, or the refusal naming its first bad attribute.

    Never raises an ``Exception``. Settings are read first, so ``on_error = "raise"``
    covers the runtime's faults too; ``resident_tensors()`` is called once, last, and
    only when the plugin is enabled.
    """
    where = Placement("unknown device")
    settings: L2EvictSettings | None = None
    raising = False
    seen = snapshot(runtime)  # never raises an Exception: each attribute read once, here
    try:
        where = placement(seen)
        config = seen.get("config")
        if config is not None and not isinstance(config, Mapping):
            raise seen.bad("config", "the deployment config as a mapping")
        section = _section_of(config)
        raising = on_error_raises(section.get("on_error"))  # before validation: its faults too
        settings = settings_from_section(section)
        raising = settings.raising
        return _checked(runtime, seen, where, settings, raising)
    except Exception as error:
        # Its traceback would hold this frame, and through it the host's objects.
        error = error.with_traceback(None)
        kv_sizing = _kv_sizing_or_reserved(seen)
        return Refused(runtime, HOST, where, settings, raising, error, kv_sizing)


def _section_of(config: object) -> dict[str, Any]:
    """The plugin's section of ``runtime.config`` (:func:`read_section`). A read of the host's
    mapping that raises is named as ``runtime.config``'s, with what it raised: the settings
    module, which also reads config files, names the config as a deployment config, and a
    host's own exception would reach the line bare."""
    handled = sys.exc_info()[1]  # the host's own, if it calls the hook inside an except block
    try:
        return read_section(config)
    except Exception as error:
        # Ours (a table that is not one, a near miss), unless a host's read raised under it.
        raised = error.__context__ if isinstance(error, L2EvictError) else error
        if raised is None or raised is handled or isinstance(raised, L2EvictError):
            raise
        raise RuntimeContractError(
            f"runtime.config raised {described(raised, 200)} when read for "
            f"[{'.'.join(SECTION)}]: the host must pass the deployment config as a mapping whose "
            f"reads do not raise ({_CONTRACT})"
        ) from None


def _checked(
    runtime: object, seen: Snapshot, where: Placement, settings: L2EvictSettings, raising: bool
) -> Request:
    """Every contract attribute checked (:mod:`._request`'s bounds), in the contract's order."""
    for name in RUNTIME_ATTRIBUTES:
        if name in seen.errors and name != "kv_allocator":
            raise seen.bad(name, "an attribute that can be read")
    device = seen.checked("device", _request.usable_device)
    seen.topology()
    jobs = seen.checked("race_jobs", _request.race_jobs)
    l2 = seen.checked("l2_cache_bytes", lambda value: _request.l2_cache_bytes(value, device))
    kv_sizing = seen.checked("kv_sizing", _kv_sizing)
    add = None if kv_sizing == "measured" else _add_reclaimed(seen)
    tensors = seen.get("resident_tensors")
    if not callable(tensors):
        raise seen.bad("resident_tensors", "a method returning the resident tensors by name")
    return Request(
        owner=runtime,
        wording=HOST,
        placement=where,
        settings=settings,
        raising=raising,
        device=device,
        race_jobs=jobs,
        l2_cache_bytes=l2,
        kv_sizing=kv_sizing,
        add=add,
        tensors=_resident(tensors) if settings.enabled else None,
    )


def _kv_sizing(value: object) -> KVSizing:
    if value is None:  # a host that says nothing sizes as the seed's flare does
        return "reserved"
    if type(value) is str and value in ("reserved", "measured"):
        return "reserved" if value == "reserved" else "measured"
    raise OutOfBounds("kv_sizing", "'reserved' (a budget set aside before the races) or 'measured'")


def _kv_sizing_or_reserved(seen: Snapshot) -> KVSizing:
    """What the host said of its KV sizing, for the agreement of a refused start-up: the
    snapshot's value (the attribute is not read again)."""
    try:
        return _kv_sizing(seen.get("kv_sizing"))
    except OutOfBounds:
        return "reserved"


def _add_reclaimed(seen: Snapshot) -> Callable[[Any], object]:
    """``kv_allocator.add_reclaimed``, refused if it would never run (async, a generator)."""
    add = seen.add_reclaimed
    if "kv_allocator" in seen.errors or add is None:
        raise seen.bad(
            "kv_allocator",
            "an object with add_reclaimed(report) (or runtime.kv_sizing = 'measured')",
        )
    call = getattr(type(add), "__call__", None)  # noqa: B004  # the class's, for callable objects
    for never_runs, what in (
        (inspect.iscoroutinefunction, "a coroutine function (async def)"),
        (inspect.isgeneratorfunction, "a generator function (its body runs only when iterated)"),
        (inspect.isasyncgenfunction, "an async generator function"),
    ):
        if never_runs(add) or (not inspect.isroutine(add) and never_runs(call)):
            raise RuntimeContractError(
                f"runtime.kv_allocator.add_reclaimed is {what}: the plugin calls it "
                "synchronously, so its credit would never be applied; fix: make add_reclaimed "
                "a plain function that grows the KV budget before returning"
            )
    return add


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


def _resident(resident_tensors: Callable[[], object]) -> Mapping[str, torch.Tensor]:
    """``resident_tensors()``, called once, checked to be a mapping; bounded time whatever it is."""
    try:
        found = resident_tensors()
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
