"""Stopping the plugin at a point of its code, as a signal handler would stop it there.

A caller names the point (a :class:`Target`: a code object and a line of it, or its entry or
its return, or a point inside a line: just after one of its C calls returns) and what runs
there, and runs its code under a :class:`Stop`; a sweep lists its points with
:func:`first_hits`. The engine here owns the tracing (``sys.settrace``'s line, call and return
events and ``sys.setprofile``'s ``c_return``, on the caller's thread). CPython runs a pending
signal handler just there, after a C call returns, so a move of state written as two C calls
in one line is two points, and a sweep that stops at both finds a step lost between them.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, Literal, Protocol, TypeVar

_T = TypeVar("_T")

Event = Literal["call", "line", "return", "c_return", "entry"]
"""Where in a frame of the target's code: its entry, a line, its return, or inside a line just
after a C function it called returned; ``entry`` is its entry as the profile function sees it
(a trace callback's exception turns tracing off, not profiling: a second stop of one call)."""


@dataclass(frozen=True)
class Target:
    """A point to stop at: the first time a frame of ``code`` reaches ``event`` (for a line, at
    ``line``; ``None``: its first line event)."""

    code: CodeType
    line: int | None = None
    event: Event = "line"
    callee: str | None = None
    """For ``c_return``: the C function whose return it is (its qualified name)."""

    @property
    def file(self) -> str:
        return self.code.co_filename

    def __str__(self) -> str:
        where = f"{os.path.basename(self.file)}:{self.line if self.event == 'line' else self.event}"
        if self.event == "c_return":
            where = f"{os.path.basename(self.file)}:{self.line} after {self.callee}() returned"
        return where


def _callee(function: object) -> str:
    """A C function's name as a profile function sees it (``list.remove``, ``setattr``)."""
    return str(getattr(function, "__qualname__", None) or type(function).__name__)


def _code_of(function: Callable[..., Any]) -> CodeType:
    code: CodeType = getattr(function, "__func__", function).__code__
    return code


def line_of(function: Callable[..., Any], text: str) -> int:
    """The number of ``function``'s first source line that starts with ``text``."""
    source, first = inspect.getsourcelines(_code_of(function))
    return first + next(i for i, line in enumerate(source) if line.strip().startswith(text))


def at(function: Callable[..., Any], text: str | None = None, event: Event = "line") -> Target:
    """``function``'s line that starts with ``text`` (``None``: the first line it runs), or its
    entry or return (``event``). A method is taken through ``__func__``; a decorated function
    is passed unwrapped (``f.__wrapped__``)."""
    return Target(_code_of(function), None if text is None else line_of(function, text), event)


class Tracer(Protocol):
    """Runs a call, with whatever this engine watches for watched."""

    def run(self, call: Callable[[], _T]) -> _T: ...


class _Untraced:
    def run(self, call: Callable[[], _T]) -> _T:
        return call()


UNTRACED: Tracer = _Untraced()
"""A call run as it is: what a sweep's warm-up runs under."""


class _Traced:
    """This thread's trace function (and, for points inside a line, its profile function) set
    around a call, and off again whatever it raised."""

    _profiles = False  # whether _profile is wanted: it costs a call per C call of every frame

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        raise NotImplementedError

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        raise NotImplementedError

    def run(self, call: Callable[[], _T]) -> _T:
        with self.tracing():
            return call()

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """The same around a block (for a call a ``with`` statement makes, such as ``__exit__``)."""
        sys.settrace(self._trace)
        if self._profiles:
            sys.setprofile(self._profile)
        try:
            yield
        finally:
            sys.setprofile(None)
            sys.settrace(None)


class Stop(_Traced):
    """Runs ``act`` once, at the first time its :class:`Target` is reached (``nth``: the n-th
    time): on the traced thread, between two lines, as a signal handler would. After it fired,
    nothing more is traced (what ``act`` runs included). Only frames of the target's code are
    traced line by line: the same first hit, without a trace call per line of every other
    frame."""

    def __init__(self, target: Target, act: Callable[[], object], nth: int = 1) -> None:
        self.target = target
        self._act = act
        self._fired: list[Target] = []
        self._profiles = target.event in ("c_return", "entry")
        self._left = nth  # hits before it fires, this one included

    @property
    def fired(self) -> bool:
        """Whether the target was reached (and ``act`` ran)."""
        return bool(self._fired)

    def _fire(self) -> None:
        self._left -= 1
        if self._left:
            return
        self._fired.append(self.target)
        self._act()

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        # What this raises goes into ``frame`` just after the C call returned, as a signal
        # handler's exception would (and CPython then turns profiling off: one shot).
        target = self.target
        if not self._fired and target.event == "entry":
            if event == "call" and frame.f_code is target.code:
                self._fire()
            return
        if (
            not self._fired
            and event == "c_return"
            and frame.f_code is target.code
            and frame.f_lineno == target.line
            and _callee(arg) == target.callee
        ):
            self._fire()

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self._fired or frame.f_code is not self.target.code:
            return None
        if self.target.event in ("c_return", "entry"):
            return None
        if self.target.event == "call":
            self._fire()
            return None
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        target = self.target
        if not self._fired and event == target.event and target.line in (None, frame.f_lineno):
            self._fire()
        return self._local


class Stops(_Traced):
    """Several :class:`Stop` on one thread at once, each firing as it would alone: for an
    interleaving that needs an act at more than one point of one call."""

    def __init__(self, *stops: Stop) -> None:
        self.stops = stops
        self._profiles = any(stop._profiles for stop in stops)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        for stop in self.stops:
            if stop._profiles:
                stop._profile(frame, event, arg)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        found = [each for stop in self.stops if (each := stop._trace(frame, event, arg))]
        if not found:
            return None

        def every(frame: FrameType, event: str, arg: Any) -> Any:
            for each in found:
                each(frame, event, arg)
            return every

        return every


class _FirstHits(_Traced):
    def __init__(
        self,
        within: Callable[[CodeType], bool],
        every_line: bool,
        inside_lines: Callable[[CodeType], bool] | None,
    ) -> None:
        self._within = within
        self._every_line = every_line
        self._inside_lines = inside_lines
        self._profiles = inside_lines is not None
        self.order: dict[tuple[str, int] | tuple[str, int, str], Target] = {}
        self._seen: set[tuple[str, int]] = set()
        self._seen_inside: set[tuple[str, int, str]] = set()
        self._fresh: dict[int, bool] = {}  # frame id -> entered from outside, until its first line

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self._within(frame.f_code):
            return None
        caller = frame.f_back
        self._fresh[id(frame)] = caller is None or not self._within(caller.f_code)
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "line":
            return self._local
        entry = self._fresh.pop(id(frame), False)
        line = (frame.f_code.co_filename, frame.f_lineno)
        if line not in self._seen:
            self._seen.add(line)
            skipped = entry or linecache.getline(*line).lstrip().startswith("try:")
            if self._every_line or not skipped:
                self.order[line] = Target(frame.f_code, frame.f_lineno)
        return self._local

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        inside = self._inside_lines
        if event != "c_return" or inside is None or not inside(frame.f_code):
            return
        callee = _callee(arg)
        point = (frame.f_code.co_filename, frame.f_lineno, callee)
        if point not in self._seen_inside:
            self._seen_inside.add(point)
            self.order[point] = Target(frame.f_code, frame.f_lineno, "c_return", callee)


def first_hits(
    run: Callable[[Tracer], object],
    within: Callable[[CodeType], bool],
    *,
    every_line: bool = False,
    inside_lines: Callable[[CodeType], bool] | None = None,
) -> tuple[Target, ...]:
    """Every line of the code ``within`` accepts that ``run`` reaches under the tracer it is
    handed, each once, in the order it is first reached: the points a sweep stops at. Where
    ``inside_lines`` accepts the code too, also every point inside a line, just after each C
    function a line calls returns (each line's each callee once): where a signal handler runs
    between two C calls of one line.

    Unless ``every_line``, left out as no signal handler's exception or call can come from
    inside the plugin there: the first line of a frame entered from outside ``within`` (a hook,
    a block's enter or exit, ``restore()``: an exception there is raised in the host's own call,
    before the plugin ran) and ``try:`` lines (they run nothing). A ``with`` line's second
    event (its exit, bpo-29988: an exception a trace function raises there skips
    ``__exit__``, which a signal handler's cannot) is never a first hit.
    """
    recorder = _FirstHits(within, every_line, inside_lines)
    run(recorder)
    return tuple(recorder.order.values())


class AsynchronousInterrupt(KeyboardInterrupt):
    """What a signal handler raises, delivered at a chosen point of the plugin."""


def interrupt(where: str) -> Callable[[], None]:
    """An act that raises :class:`AsynchronousInterrupt` naming ``where``."""

    def raise_it() -> None:
        raise AsynchronousInterrupt(where)

    return raise_it
