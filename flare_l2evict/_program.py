"""The adapter for programs that are not flare hosts: :func:`evicting_from`.

Its arguments become a frozen :class:`BlockArguments`; on entry they are checked
against the one set of bounds (:mod:`._request`), in the program's words, and the
core runs (:func:`._core.start`): the report is returned, not offered, and every
line names the block's arguments, not a runtime's.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Literal, TypeVar

import torch
from pydantic import ValidationError

from . import _core, _request
from ._errors import L2EvictError, reason_of
from ._report import PROGRAM, ReclaimReport
from ._request import OutOfBounds, Placement, Request
from ._settings import ALLOWED, L2EvictSettings, on_error_raises
from ._startup import Startup, end_dropped
from ._text import described_value, literal

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

_T = TypeVar("_T")
_NONE = object()
_FIX = 'as the README\'s "Without flare" shows'
_FIXES = {
    "device": "pass device= as a torch.device or text of a cuda (or cpu) device",
    "race_jobs": "pass race_jobs=, how many b12x race jobs the program holds at once",
    "l2_cache_bytes": "pass None on a CUDA device (read from it) or the L2 size in bytes",
}


@dataclass(frozen=True)
class BlockArguments:
    """What the program passed to :func:`evicting_from`, as it passed it (checked on entry)."""

    race_jobs: object
    device: object
    l2_cache_bytes: object
    window: object
    exclude: object
    on_error: object
    triton: object = True

    @property
    def raising(self) -> bool:
        """Whether the program asked for ``on_error = "raise"``: :func:`on_error_raises`."""
        return on_error_raises(self.on_error)


class _Refusal(Exception):
    """What is wrong with the block's arguments, in the program's words."""


def _plain(value: object) -> object:
    """A ``str`` subclass of the program's as the plain text it holds (its methods may raise)."""
    return str.__str__(value) if issubclass(type(value), str) else value


def _settings(given: BlockArguments) -> L2EvictSettings:
    values = {"window": _plain(given.window), "exclude": given.exclude}
    values["on_error"] = _plain(given.on_error)
    values["triton"] = given.triton
    try:
        return L2EvictSettings.model_validate(values)
    except ValidationError as error:
        key = str(error.errors()[0]["loc"][0]) if error.errors()[0]["loc"] else "window"
    except Exception:  # an exclude of the program's whose iteration raises
        key = "exclude"
    fix = (
        "pass triton=True or triton=False"
        if key == "triton"
        else "pass window=, exclude= (a list of globs) and on_error= " + _FIX
    )
    raise _Refusal(
        f"{key} = {literal(values.get(key))} is invalid: use {ALLOWED.get(key, 'what ' + _FIX)}; "
        f"nothing changed; fix: {fix}"
    )


def _first_device(tensors: object) -> object:
    """The first tensor's device, or why there is none, in the program's words."""
    first: object = _NONE  # stays so when tensors is no mapping, is empty, or iterating it raised
    if isinstance(tensors, Mapping):
        try:
            first = next(iter(tensors.values()), _NONE)
        except Exception:
            pass
    try:
        found = first.device  # type: ignore[attr-defined]
        if type(found) is torch.device:
            return found
    except Exception:
        pass
    what = (
        f"tensors is {described_value(tensors)}, not a non-empty mapping of names to tensors"
        if first is _NONE
        else f"the first value of tensors is {described_value(first, 80)}, not a tensor"
    )
    raise _Refusal(
        f"{what}, and no device was given; nothing changed; fix: pass {{name: tensor}} "
        "for the tensors that stay resident, or device="
    )


def _bounded(name: str, value: object, check: Callable[[], _T]) -> _T:
    """``check()``; a value out of the one set of bounds becomes the program's line."""
    try:
        return check()
    except OutOfBounds as bounds:
        raise _Refusal(
            f"{name} = {described_value(value, 80)}; nothing changed; fix: {_FIXES[name]} "
            f"({bounds.accepts})"
        ) from None


def _request_of(block: _Block, tensors: object, given: BlockArguments) -> Request:
    """The block's request by keyword, or :class:`_Refusal` naming its first bad argument."""
    settings = _settings(given)
    named = given.device if given.device is not None else _first_device(tensors)
    device = _bounded("device", named, lambda: _request.usable_device(named))
    if not isinstance(tensors, Mapping):
        raise _Refusal(
            f"tensors is {described_value(tensors)}, not a mapping of names to tensors; "
            "nothing changed; fix: pass {name: tensor} for the tensors that stay resident"
        )
    jobs = _bounded("race_jobs", given.race_jobs, lambda: _request.race_jobs(given.race_jobs))
    l2 = _bounded(
        "l2_cache_bytes",
        given.l2_cache_bytes,
        lambda: _request.l2_cache_bytes(given.l2_cache_bytes, device),
    )
    return Request(
        owner=block,
        wording=PROGRAM,
        placement=Placement(str(device)),
        settings=settings,
        raising=settings.raising,
        device=device,
        race_jobs=jobs,
        l2_cache_bytes=l2,
        kv_sizing="reserved",
        add=None,
        tensors=tensors,
    )


def _orphaned(report: ReclaimReport) -> None:
    """A block gone with its start-up still active (its exit was cut short, or never called):
    that start-up ends, named (:func:`~flare_l2evict._startup.end_dropped`). A block whose
    exit ran is gone silently."""
    end_dropped(
        report,
        "flare_l2evict: an evicting_from block was dropped before its exit ran, so its "
        "start-up (%s) ends now; fix: enter it in a with statement around the races",
        "an evicting_from block dropped before its exit",
    )


class _Block:
    """One ``evicting_from`` block: its arguments, then, once entered, its start-up.

    It holds the program's mapping only until the core has read it: no tensor only it
    held counts. One object is one block, entered once: a second entry (nested, from a
    generator, on another thread, or after the first ended) raises one line, so no exit
    follows it and the first entry's block stands until its own exit.
    """

    def __init__(self, tensors: object, arguments: BlockArguments) -> None:
        self._tensors: object = tensors
        self._arguments = arguments
        self._entered = threading.Lock()  # taken by the first entry, never given back

    def __enter__(self) -> ReclaimReport:
        if not self._entered.acquire(blocking=False):
            raise L2EvictError(
                "this evicting_from block was already entered; a block is entered once, and "
                "this entry changed nothing; fix: make a new evicting_from(...) for each with "
                "statement"
            )
        return self._enter()

    def _enter(self) -> ReclaimReport:
        tensors, self._tensors = self._tensors, None
        try:
            request = _request_of(self, tensors, self._arguments)
        except _Refusal as refusal:
            return _core.faulted(_zero(str(refusal)), raising=self._arguments.raising)
        except Exception as error:  # arguments of the program's whose methods raise
            why = f"an argument could not be read ({reason_of(error)}); nothing changed"
            return _core.faulted(_zero(why), raising=self._arguments.raising)
        del tensors
        try:
            report = _core.start(request)
            # An exception at the very entry of __exit__ (a signal handler's) runs none of
            # its lines; the with statement then drops the block, and this ends its start-up.
            weakref.finalize(self, _orphaned, report)
            return report
        except BaseException:  # no __exit__ follows a raising __enter__: end it here
            Startup.end(self, own_only=True)
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Whatever ended the block, it ends the same: the start-up it began, if any."""
        Startup.end(self, own_only=True)


def _zero(problem: str) -> ReclaimReport:
    return ReclaimReport(
        device="unknown",
        reclaimed_bytes=0,
        mechanism="none",
        reason=f"evicting_from: {problem}",
    )


def evicting_from(
    tensors: Mapping[str, torch.Tensor],
    *,
    race_jobs: int,
    device: torch.device | str | None = None,
    l2_cache_bytes: int | None = None,
    window: int | str = "stock",
    exclude: Sequence[str] = (),
    on_error: Literal["fallback", "raise"] = "fallback",
    triton: bool = True,
) -> AbstractContextManager[ReclaimReport]:
    """Inside the block, b12x's races evict L2 by reading ``tensors``; yields the report.

    ``tensors`` stay resident (and unwritten while races run) for the whole block;
    ``race_jobs`` is how many race jobs the program holds at once; ``device``
    defaults to the first tensor's; ``l2_cache_bytes`` ``None`` reads the CUDA
    device's; ``window``, ``exclude``, ``on_error`` and ``triton`` are the plugin's settings
    (``triton=False`` keeps Triton's autotuner flush stock inside the block).

    Invariants: ``reclaimed_bytes`` is what the block's races will not allocate (0,
    with the reason, when it falls back to stock b12x); on exit, exceptions
    included, stock b12x is back and nothing references the tensors. Under
    ``on_error = "fallback"`` it never raises on entry, except when the same block
    object is entered a second time (one line; the first entry stands). While another
    start-up is active in the process, it reports 0 and changes nothing.
    """
    arguments = BlockArguments(
        race_jobs=race_jobs,
        device=device,
        l2_cache_bytes=l2_cache_bytes,
        window=window,
        exclude=exclude,
        on_error=on_error,
        triton=triton,
    )
    return _Block(tensors, arguments)
