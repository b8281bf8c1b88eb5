"""Host code that notes whether this thread holds the plugin's lock each time it runs: the
host's runtime, mapping, tensors and allocator, its torch modes and log handler, a host
exception's text.

Each stand-in appends ``(what ran, whether the lock was held)`` to a shared list; a test
runs a start-up among them and asserts the second is always ``False``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from flare_l2evict import ReclaimReport
from flare_l2evict._startup import Startup
from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime
from support.hosts import runtime

Seen = list[tuple[str, bool]]
"""What host code ran, and whether this thread held the plugin's lock then."""


def lock_held_here() -> bool:
    return bool(Startup._lock._is_owned())  # type: ignore[attr-defined]


# Every use: attributes, the mapping's reads, tensor methods, the allocator.
class WatchedUseMappingStandIn(dict[str, torch.Tensor]):
    """The host's resident tensors, noting whether each method ran under the plugin's lock."""

    seen: Seen

    def _note(self, name: str) -> None:
        self.seen.append((name, lock_held_here()))

    def __iter__(self) -> Iterator[str]:
        self._note("__iter__")
        return super().__iter__()

    def __getitem__(self, key: str) -> torch.Tensor:
        self._note("__getitem__")
        return super().__getitem__(key)

    def values(self) -> Any:
        self._note("values")
        return super().values()

    def __len__(self) -> int:
        self._note("__len__")
        return super().__len__()


class WatchedTensorStandIn(torch.Tensor):
    """A host tensor subclass whose every torch call notes whether the plugin's lock is held."""

    seen: ClassVar[Seen] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.seen.append((getattr(func, "__name__", str(func)), lock_held_here()))
        return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]


class WatchedUseRuntimeStandIn(ReferenceRuntime):
    """A host whose every attribute read and call notes whether the plugin's lock is held."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "_seen").append((name, lock_held_here()))
        return object.__getattribute__(self, name)

    def resident_tensors(self) -> Any:
        mapping = WatchedUseMappingStandIn(object.__getattribute__(self, "tensors"))
        mapping.seen = object.__getattribute__(self, "_seen")
        return mapping


class WatchedAllocatorStandIn(ReferenceKVAllocator):
    def __init__(self, seen: Seen) -> None:
        super().__init__(1024)
        self.seen = seen

    def add_reclaimed(self, report: ReclaimReport) -> None:
        self.seen.append(("add_reclaimed", lock_held_here()))
        super().add_reclaimed(report)


# Its drop and its surroundings: torch modes, a log handler, ``__del__``, an exception's text.
class RecordingFunctionModeStandIn(TorchFunctionMode):
    """A host's torch function mode (a profiler's): notes every torch call it sees."""

    def __init__(self, seen: Seen) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append((f"function {getattr(func, '__name__', func)}", lock_held_here()))
        return func(*args, **(kwargs or {}))


class RecordingDispatchModeStandIn(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A host's torch dispatch mode: notes every operator it sees."""

    def __init__(self, seen: Seen) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append((f"dispatch {func}", lock_held_here()))
        return func(*args, **(kwargs or {}))


class RecordingHandlerStandIn(logging.Handler):
    """A host's log handler: notes every line it is handed."""

    def __init__(self, seen: Seen) -> None:
        super().__init__(logging.DEBUG)
        self.seen = seen

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(("log handler", lock_held_here()))


class WatchedDropMappingStandIn(dict[str, torch.Tensor]):
    """The host's resident tensors, dropped by the plugin once it chose: notes its ``__del__``."""

    seen: Seen

    def __del__(self) -> None:
        self.seen.append(("mapping __del__", lock_held_here()))


class WatchedLifeRuntimeStandIn(ReferenceRuntime):
    """A host whose every attribute read, and its ``__del__``, notes whether the lock is held."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "_seen").append((f"runtime.{name}", lock_held_here()))
        return object.__getattribute__(self, name)

    def resident_tensors(self) -> Any:
        mapping = WatchedDropMappingStandIn(object.__getattribute__(self, "tensors"))
        mapping.seen = object.__getattribute__(self, "_seen")
        return mapping

    def __del__(self) -> None:
        object.__getattribute__(self, "_seen").append(("runtime __del__", lock_held_here()))


class HostErrorStandIn(RuntimeError):
    """A host exception whose text is the host's code."""

    seen: ClassVar[Seen] = []

    def __str__(self) -> str:
        HostErrorStandIn.seen.append(("host exception __str__", lock_held_here()))
        return "the allocator's own failure"


class AppliesThenRaisesHostErrorStandIn(ReferenceKVAllocator):
    """Applies the credit, then raises a host exception (the credit stands)."""

    def add_reclaimed(self, report: ReclaimReport) -> None:
        super().add_reclaimed(report)
        raise HostErrorStandIn


def watched_host(seen: Seen, **more: Any) -> ReferenceRuntime:
    """A host whose attribute reads, mapping and runtime drops are watched into ``seen``."""
    host = runtime(kind=WatchedLifeRuntimeStandIn, **more)
    object.__setattr__(host, "_seen", seen)
    return host


@contextlib.contextmanager
def watching(seen: Seen) -> Iterator[None]:
    """The host's torch modes and log handler, around whatever runs inside."""
    logger = logging.getLogger("flare_l2evict")
    handler, level = RecordingHandlerStandIn(seen), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with RecordingFunctionModeStandIn(seen), RecordingDispatchModeStandIn(seen):
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
