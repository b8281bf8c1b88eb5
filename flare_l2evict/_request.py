"""What a start-up is asked to do, and the one set of bounds every caller's values meet.

Both adapters, :mod:`.plugin` for hosts and :mod:`._program` for programs, read
their caller's values, check each with the functions here, and build a
:class:`Request` by keyword. A value out of bounds raises :class:`OutOfBounds`
naming the value and what it accepts; the adapter words it (a host's line names
``runtime.race_jobs``, a program's its ``race_jobs=`` argument).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from ._report import ReclaimReport, Wording
from ._settings import L2EvictSettings

MAX_RACE_JOBS = 1024
"""More concurrent race jobs than any b12x start-up holds; above it the value is a bug."""

MAX_L2_BYTES = 1 << 32
"""4 GiB: far above any GPU's L2 (128 MiB on GB202); above it the value is a bug."""

KVSizing = Literal["reserved", "measured"]
"""How the host sizes its KV cache (docs/host-contract.md): only a *reserved* budget takes a
credit; a *measured* one already sees the bytes the races stopped allocating."""


class OutOfBounds(ValueError):
    """A caller's value outside what the core accepts: ``name`` and what it ``accepts``."""

    def __init__(self, name: str, accepts: str) -> None:
        super().__init__(f"{name}: {accepts}")
        self.name = name
        self.accepts = accepts


@dataclass(frozen=True)
class Placement:
    """Where this process sits, for every line and report (valid whatever the caller passed)."""

    device: str
    rank: int = 0
    world_size: int = 1
    process_group: object | None = None


@dataclass
class Request:
    """A start-up's checked inputs: everything the core reads, and nothing else of the caller's.

    ``tensors`` is handed to the core once (:meth:`take_tensors`), which drops it once
    the choice is made, so every other holder of a weight is the caller's.
    ``add`` ``None``: nothing is offered (a program keeps the report; a *measured*
    host sizes its KV cache by measurement).
    """

    owner: object
    wording: Wording
    placement: Placement
    settings: L2EvictSettings
    raising: bool
    device: torch.device
    race_jobs: int
    l2_cache_bytes: int | None
    kv_sizing: KVSizing
    add: Callable[[ReclaimReport], object] | None
    tensors: Mapping[str, torch.Tensor] | None

    def take_tensors(self) -> Mapping[str, torch.Tensor] | None:
        """The caller's mapping, once; the request holds it no longer."""
        tensors, self.tensors = self.tensors, None
        return tensors


@dataclass(frozen=True)
class Refused:
    """A caller whose input failed the check (``error``): it credits 0, and still takes its
    turn in the tensor-parallel agreement, so that no other rank waits for it."""

    owner: object
    wording: Wording
    placement: Placement
    settings: L2EvictSettings | None
    raising: bool
    error: Exception
    kv_sizing: KVSizing = "reserved"


def whole_number(value: object) -> int | None:
    """``value`` as an ``int`` if it is a whole number (never a bool), else ``None``."""
    try:  # isinstance itself reads __class__, which a caller's object may make raise
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return None
        whole = int(value)
    except Exception:  # an Integral of the caller's whose __int__ raises
        return None
    return whole if type(whole) is int else None


def device_named(value: object) -> torch.device | None:
    """A ``cpu`` or ``cuda`` device from a ``torch.device`` or its text, else ``None``."""
    try:
        if type(value) is torch.device:
            device = value
        elif isinstance(value, str):
            device = torch.device(str.__str__(value))
        else:
            return None
    except Exception:  # not a device torch knows, or a str subclass of the caller's
        return None
    return device if device.type in ("cpu", "cuda") else None


def usable_device(value: object) -> torch.device:
    """A device this process can use: ``cpu``, or a CUDA device that exists here."""
    device = device_named(value)
    if device is None:
        raise OutOfBounds("device", "a torch.device of type cuda (or cpu), or its text")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise OutOfBounds(
                "device", "a device this process can use (CUDA is not available here)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise OutOfBounds("device", f"a CUDA device in 0..{torch.cuda.device_count() - 1}")
    return device


def race_jobs(value: object) -> int:
    """The race jobs held at once, ``0..MAX_RACE_JOBS``; 0 is allowed and credits nothing
    (a host may start a model that races no kernel)."""
    jobs = whole_number(value)
    if jobs is None or not 0 <= jobs <= MAX_RACE_JOBS:
        raise OutOfBounds("race_jobs", f"a whole number in 0..{MAX_RACE_JOBS}")
    return jobs


def l2_cache_bytes(value: object, device: torch.device) -> int | None:
    """The L2 size in ``1..MAX_L2_BYTES``, or ``None`` on a CUDA device (read from it)."""
    if value is None and device.type == "cuda":
        return None
    size = None if value is None else whole_number(value)
    if size is None or not 0 < size <= MAX_L2_BYTES:
        raise OutOfBounds(
            "l2_cache_bytes",
            f"the L2 size in bytes (1..{MAX_L2_BYTES:,}), or None on a CUDA device",
        )
    return size
