"""The start-up's promise for programs that are not flare hosts: :func:`evicting_from`.

Its arguments are checked once, then the core (:mod:`._core`) runs: the report is
returned, not offered, and every line names the block's arguments, not a runtime's.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import ValidationError

from . import _core, _startup
from ._core import Clock, Local
from ._errors import L2EvictError, reason_of
from ._lifecycle import PROCESS, Startup, ensure_ended
from ._log import say
from ._report import PROGRAM, ReclaimReport
from ._runtime import MAX_L2_BYTES, MAX_RACE_JOBS, Placement, _device, whole_number
from ._settings import ALLOWED, L2EvictSettings, wants_raise
from ._text import described_value, literal

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

log = logging.getLogger("flare_l2evict")

_NONE = object()
_Checked = tuple[torch.device, int, int | None, L2EvictSettings]
_FIX = 'as the README\'s "Without flare" shows'


def _plain(value: object) -> object:
    """A ``str`` subclass of the program's as the plain text it holds (its methods may raise)."""
    return str.__str__(value) if issubclass(type(value), str) else value


def _settings(window: object, exclude: object, on_error: object) -> L2EvictSettings | str:
    """The block's settings, or what is wrong with one, in the program's words."""
    given = {"window": _plain(window), "exclude": exclude, "on_error": _plain(on_error)}
    try:
        return L2EvictSettings.model_validate(given)
    except ValidationError as error:
        key = str(error.errors()[0]["loc"][0]) if error.errors()[0]["loc"] else "window"
    except Exception:  # an exclude of the program's whose iteration raises
        key = "exclude"
    return (
        f"{key} = {literal(given.get(key))} is invalid: use {ALLOWED.get(key, 'what ' + _FIX)}; "
        "nothing changed; fix: pass window=, exclude= (a list of globs) and on_error= " + _FIX
    )


def _device_of(tensors: object, device: object) -> torch.device | str:
    """The block's device (given, else the first tensor's), or what is wrong, in its words."""
    if device is not None:
        found = device if type(device) is torch.device else _device(device)
        if found is None:
            return (
                f"device = {described_value(device, 80)}; nothing changed; fix: pass device= "
                "as a torch.device or text of a cuda (or cpu) device"
            )
        if not isinstance(tensors, Mapping):
            return (
                f"tensors is {described_value(tensors)}, not a mapping of names to tensors; "
                "nothing changed; fix: pass {name: tensor} for the tensors that stay resident"
            )
        return found
    first: object = _NONE  # stays so when tensors is no mapping, is empty, or iterating it raised
    if isinstance(tensors, Mapping):
        try:
            first = next(iter(tensors.values()), _NONE)
        except Exception:
            pass
    try:
        found = first.device  # type: ignore[attr-defined]
        if type(found) is torch.device and found.type in ("cpu", "cuda"):
            return found
    except Exception:
        pass
    what = (
        f"tensors is {described_value(tensors)}, not a non-empty mapping of names to tensors"
        if first is _NONE
        else f"the first value of tensors is {described_value(first, 80)}, not a tensor"
    )
    return (
        f"{what}, and no device was given; nothing changed; fix: pass {{name: tensor}} "
        "for the tensors that stay resident, or device="
    )


def _checked(tensors: object, given: dict[str, Any]) -> _Checked | str:
    """The block's arguments checked, or what is wrong with the first bad one, in its words."""
    settings = _settings(given["window"], given["exclude"], given["on_error"])
    if isinstance(settings, str):
        return settings
    device = _device_of(tensors, given["device"])
    if isinstance(device, str):
        return device
    race_jobs, l2 = given["race_jobs"], given["l2_cache_bytes"]
    jobs = whole_number(race_jobs)
    if jobs is None or not 0 < jobs <= MAX_RACE_JOBS:
        return (
            f"race_jobs = {described_value(race_jobs, 80)}; nothing changed; fix: pass "
            "race_jobs=, how many b12x race jobs the program holds at once (a whole number "
            f"in 1..{MAX_RACE_JOBS})"
        )
    size = None if l2 is None else whole_number(l2)
    if (l2 is not None and (size is None or not 0 < size <= MAX_L2_BYTES)) or (
        l2 is None and device.type != "cuda"
    ):
        return (
            f"l2_cache_bytes = {described_value(l2, 80)} on {device}; nothing changed; fix: "
            f"pass None on a CUDA device (read from it) or the L2 size in bytes "
            f"(1..{MAX_L2_BYTES:,})"
        )
    return device, jobs, size, settings


def _refused(problem: str, raising: bool) -> ReclaimReport:
    """0 bytes and one line for a block that changes nothing."""
    reason = f"evicting_from: {problem}"
    if raising:
        raise L2EvictError(f"l2evict failed and on_error = 'raise': {reason}")
    report = ReclaimReport(device="unknown", reclaimed_bytes=0, mechanism="none", reason=reason)
    say(log, logging.WARNING, "flare_l2evict: stock b12x eviction kept; %s", report.summary())
    return report


def _orphaned(startup: Startup) -> None:
    """A block gone with its start-up still active (its exit was cut short): end that start-up."""
    if PROCESS.current(startup) and startup.report is not None:
        _startup.finish(startup.report)


class _Block:
    """One ``evicting_from`` block: its checked arguments, then its start-up.

    It holds the program's mapping only until the core has read it: no tensor only it held counts.
    """

    def __init__(self, tensors: object, arguments: dict[str, Any]) -> None:
        self._tensors: object = tensors
        self._arguments = arguments
        self._startup: Startup | None = None

    def _take(self) -> Mapping[str, torch.Tensor]:
        tensors, self._tensors = self._tensors, None
        return tensors  # type: ignore[return-value]

    def __enter__(self) -> ReclaimReport:
        raising = wants_raise(self._arguments)
        try:
            checked = _checked(self._tensors, self._arguments)
        except Exception as error:  # arguments of the program's whose methods raise
            checked = f"an argument could not be read ({reason_of(error)}); nothing changed"
        if isinstance(checked, str):
            self._tensors = None
            return _refused(checked, raising)
        device, jobs, l2, settings = checked
        request = _core.Request(device, l2, jobs, self._take, None, PROGRAM)
        startup, new = PROCESS.begin(self)
        if not new:
            self._tensors = None
            return _refused(
                "a start-up is active in this process (a flare host's, or another evicting_from "
                "block); this block credits 0 and changes nothing; fix: run the block outside "
                "any other start-up",
                raising,
            )
        self._startup = startup
        # An exception at the very entry of __exit__ (a signal handler's) runs none of
        # its lines; the with statement then drops the block, and this ends its start-up.
        weakref.finalize(self, _orphaned, startup)
        where = Placement(str(request.device), 0, 1, None)
        local = Local(settings=settings, raising=settings.on_error == "raise")

        def body(clock: Clock) -> ReclaimReport:
            return _core.start(startup, where, local, request, clock)

        def internal(reason: str) -> ReclaimReport:
            say(log, logging.WARNING, "flare_l2evict: stock b12x eviction kept; %s", reason)
            return ReclaimReport(
                device=where.device, reclaimed_bytes=0, mechanism="none", reason=reason
            )

        try:
            return _core.guarded(startup, body, internal)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exception: object) -> None:  # whatever ended the block, it ends the same
        try:
            self._tensors = None
            if self._startup is not None:
                _startup.finish(self)
        finally:  # an exception above (a signal handler's) still ends the block's start-up
            if self._startup is not None:
                self._startup = None
                ensure_ended(self, False)


def evicting_from(
    tensors: Mapping[str, torch.Tensor],
    *,
    race_jobs: int,
    device: torch.device | str | None = None,
    l2_cache_bytes: int | None = None,
    window: int | str = "stock",
    exclude: Sequence[str] = (),
    on_error: Literal["fallback", "raise"] = "fallback",
) -> AbstractContextManager[ReclaimReport]:
    """Inside the block, b12x's races evict L2 by reading ``tensors``; yields the report.

    ``tensors`` stay resident (and unwritten while races run) for the whole block;
    ``race_jobs`` is how many race jobs the program holds at once; ``device``
    defaults to the first tensor's; ``l2_cache_bytes`` ``None`` reads the CUDA
    device's; ``window``, ``exclude`` and ``on_error`` are the plugin's settings.

    Invariants: ``reclaimed_bytes`` is what the block's races will not allocate (0,
    with the reason, when it falls back to stock b12x); on exit, exceptions
    included, stock b12x is back and nothing references the tensors. Under
    ``on_error = "fallback"`` it never raises on entry. While another start-up is
    active in the process, it reports 0 and changes nothing.
    """
    arguments = {
        "race_jobs": race_jobs,
        "device": device,
        "l2_cache_bytes": l2_cache_bytes,
        "window": window,
        "exclude": exclude,
        "on_error": on_error,
    }
    return _Block(tensors, arguments)
