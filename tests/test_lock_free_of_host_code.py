"""No host code runs while the plugin holds its lock (issue 41).

Case -> outcome:

- a host's ``TorchFunctionMode`` and ``TorchDispatchMode``, a log handler, a runtime's
  properties and ``__del__``, a mapping's ``__del__``, the fork's API and a host exception's
  ``__str__``, through a host's whole start-up (hook, a refused second hook, a stranger's
  ``startup_complete``, ``restore()``, its own ``startup_complete``), an ``evicting_from``
  block and the tools' ``install(...)`` -> none runs while this thread holds the lock;
- a profiler's mode that takes a host lock, and a host thread that holds that lock while it
  calls ``startup_complete`` (during the hook) or ``restore()`` (during the fork's undo) ->
  both finish (a child process with a deadline: a regression fails, never hangs);
- a restore on another thread paused after it claimed an undo step -> the slot stays taken
  until that step ran, so the next start-up's install is never undone by it.

Stand-ins are named so; pluggy, the plugin, b12x's real seam, torch's modes and logging are
real.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import torch
from support.fake_b12x import use_fork_api
from support.figures import MiB
from support.hosts import CREDIT, JOBS, L2, complete, hook, runtime, seam_is_ours, weights
from support.startups import restore_paused
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import flare_l2evict
from flare_l2evict import ReclaimReport
from flare_l2evict._b12x.proof import measure_basis
from flare_l2evict._startup import Startup
from flare_l2evict.tools._choose_weights import choose_weights, install
from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime

pytest.importorskip("b12x.preparation._measurement")
DEADLINE = 120.0  # seconds a child may take before the test calls it a deadlock

Seen = list[tuple[str, bool]]
"""What host code ran, and whether this thread held the plugin's lock then."""


def _lock_held_here() -> bool:
    return bool(Startup._lock._is_owned())  # type: ignore[attr-defined]


class RecordingFunctionModeStandIn(TorchFunctionMode):
    """A host's torch function mode (a profiler's): notes every torch call it sees."""

    def __init__(self, seen: Seen) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append((f"function {getattr(func, '__name__', func)}", _lock_held_here()))
        return func(*args, **(kwargs or {}))


class RecordingDispatchModeStandIn(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A host's torch dispatch mode: notes every operator it sees."""

    def __init__(self, seen: Seen) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append((f"dispatch {func}", _lock_held_here()))
        return func(*args, **(kwargs or {}))


class RecordingHandlerStandIn(logging.Handler):
    """A host's log handler: notes every line it is handed."""

    def __init__(self, seen: Seen) -> None:
        super().__init__(logging.DEBUG)
        self.seen = seen

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(("log handler", _lock_held_here()))


class WatchedMappingStandIn(dict[str, torch.Tensor]):
    """The host's resident tensors, dropped by the plugin once it chose: notes its ``__del__``."""

    seen: Seen

    def __del__(self) -> None:
        self.seen.append(("mapping __del__", _lock_held_here()))


class WatchedRuntimeStandIn(ReferenceRuntime):
    """A host whose every attribute read, and its ``__del__``, notes whether the lock is held."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "_seen").append((f"runtime.{name}", _lock_held_here()))
        return object.__getattribute__(self, name)

    def resident_tensors(self) -> Any:
        mapping = WatchedMappingStandIn(object.__getattribute__(self, "tensors"))
        mapping.seen = object.__getattribute__(self, "_seen")
        return mapping

    def __del__(self) -> None:
        object.__getattribute__(self, "_seen").append(("runtime __del__", _lock_held_here()))


class HostErrorStandIn(RuntimeError):
    """A host exception whose text is the host's code."""

    seen: ClassVar[Seen] = []

    def __str__(self) -> str:
        HostErrorStandIn.seen.append(("host exception __str__", _lock_held_here()))
        return "the allocator's own failure"


class AppliesThenRaisesStandIn(ReferenceKVAllocator):
    """Applies the credit, then raises a host exception (the credit stands)."""

    def add_reclaimed(self, report: ReclaimReport) -> None:
        super().add_reclaimed(report)
        raise HostErrorStandIn


def _watched_host(seen: Seen, **more: Any) -> ReferenceRuntime:
    host = runtime(kind=WatchedRuntimeStandIn, **more)
    object.__setattr__(host, "_seen", seen)
    return host


@contextlib.contextmanager
def _watching(seen: Seen) -> Iterator[None]:
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


def _a_hosts_start_up(seen: Seen) -> None:
    host, second, stranger = _watched_host(seen), _watched_host(seen), _watched_host(seen)
    assert hook(host).reclaimed_bytes == CREDIT
    assert hook(second).reclaimed_bytes == 0  # refused: Busy, naming the active start-up
    assert complete(stranger).refused  # refused, in one line
    flare_l2evict.restore()
    assert complete(host).credited_bytes == CREDIT
    del host, second, stranger
    gc.collect()


def _a_credit_whose_allocator_raised(seen: Seen) -> None:
    host = _watched_host(seen, allocator=AppliesThenRaisesStandIn(1024))
    assert hook(host).allocator_error is not None
    assert complete(host).credited_bytes == CREDIT


def _a_fork_start_up(seen: Seen) -> None:
    host = _watched_host(seen)
    assert hook(host).mechanism == "fork"
    complete(host)


def _a_block() -> None:
    tensors = weights()  # the program keeps its weights
    with flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2) as report:
        assert report.reclaimed_bytes == CREDIT
        flare_l2evict.restore()


def _the_tools_install() -> None:
    tensors = weights()
    chosen = choose_weights(tensors, "cpu", MiB)
    basis = measure_basis(torch.device("cpu"), L2, flare_l2evict.L2EvictSettings(), 0)
    with install(chosen, basis) as installed:
        assert installed.mechanism == "stock-seam" and seam_is_ours()
        installed.restore()
    assert Startup.active() is None


@pytest.fixture
def fork_api(monkeypatch: pytest.MonkeyPatch) -> Callable[[Seen], None]:
    """Makes the loaded b12x a fork whose ``use_startup_eviction`` notes each call."""

    def make(seen: Seen) -> None:
        def use_startup_eviction(storage: object) -> None:
            seen.append(("fork API", _lock_held_here()))

        use_fork_api(monkeypatch, use_startup_eviction)

    return make


def test_no_host_code_runs_while_the_plugin_holds_its_lock(
    fork_api: Callable[[Seen], None],
) -> None:
    seen: Seen = []
    HostErrorStandIn.seen = seen
    with _watching(seen):
        _a_hosts_start_up(seen)
        _a_credit_whose_allocator_raised(seen)
        _a_block()
        _the_tools_install()
        fork_api(seen)
        _a_fork_start_up(seen)
    ran = {what.split(" ", 1)[0] if what.startswith(("function", "dispatch")) else what
           for what, _ in seen}  # fmt: skip
    # Every kind of host code did run: the watch sees what it is meant to.
    assert {
        "function",
        "dispatch",
        "log handler",
        "mapping __del__",
        "runtime __del__",
        "runtime.kv_allocator",
        "host exception __str__",
        "fork API",
    } <= ran, ran
    assert "function device" in {what for what, _ in seen}  # torch.device, as the seam calls it
    assert [what for what, held in seen if held] == []


# A profiler's mode that takes a host lock, and a host thread holding it that calls in.
_DEADLOCK = """
import json, logging, sys, threading, types
import torch
from torch.overrides import TorchFunctionMode
import flare_l2evict
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator, ReferenceRuntime, plugin_manager,
)

logging.disable(logging.CRITICAL)  # the stranger's refusals, one per call: not the subject
scenario = sys.argv[1]
if scenario == "restore-during-the-forks-undo":
    fork = types.ModuleType("b12x.comm.pcie")

    def use_startup_eviction(storage):
        torch.device("cpu")  # the fork's own torch call: the ending thread's mode sees it

    fork.use_startup_eviction = use_startup_eviction
    sys.modules["b12x.comm.pcie"] = fork

pm = plugin_manager(["l2evict"])


def runtime():
    return ReferenceRuntime(
        device=torch.device("cpu"), config={}, kv_allocator=ReferenceKVAllocator(1024),
        race_jobs=3, l2_cache_bytes=8 << 20, tensors={"w": torch.zeros(16 << 20)},
    )


host, stranger = runtime(), runtime()
profiler = threading.Lock()  # the host's lock: its mode takes it at every torch call
ready, asked, passed, done = (threading.Event() for _ in range(4))
calls = []


class ProfilerMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        ready.wait()  # the host thread holds the profiler's lock now
        ready.clear()
        asked.set()
        with profiler:
            pass
        passed.set()
        return func(*args, **(kwargs or {}))


def host_thread(action):
    # At each torch call of the plugin's thread: hold the profiler's lock, call the plugin.
    while True:
        profiler.acquire()
        ready.set()
        while not asked.wait(0.05):
            if done.is_set():
                profiler.release()
                return
        asked.clear()
        action()
        calls.append(1)
        profiler.release()
        passed.wait()
        passed.clear()


if scenario == "startup-complete-during-the-hook":
    worker = threading.Thread(
        target=host_thread, args=(lambda: pm.hook.startup_complete(runtime=stranger),)
    )
    worker.start()
    with ProfilerMode():
        (report,) = pm.hook.before_first_capture(runtime=host)
    done.set()
    worker.join()
    (audit,) = pm.hook.startup_complete(runtime=host)
else:
    (report,) = pm.hook.before_first_capture(runtime=host)
    worker = threading.Thread(target=host_thread, args=(flare_l2evict.restore,))
    worker.start()
    with ProfilerMode():
        (audit,) = pm.hook.startup_complete(runtime=host)
    done.set()
    worker.join()
print(json.dumps({
    "reclaimed": report.reclaimed_bytes, "credited": audit.credited_bytes,
    "calls": len(calls), "mechanism": report.mechanism,
    "active": flare_l2evict._startup.Startup.active() is not None,
}))
"""


@pytest.mark.slow  # a fresh interpreter per scenario, with a deadline
@pytest.mark.parametrize(
    "scenario", ["startup-complete-during-the-hook", "restore-during-the-forks-undo"]
)
def test_a_profilers_lock_held_by_a_host_thread_that_calls_in_never_deadlocks(
    scenario: str,
) -> None:
    # Before: the hook's thread called torch.device (the stock seam's install) or the fork's
    # API (its undo) under the plugin's lock; the profiler's mode then waited for the host
    # thread's lock, and the host thread, inside startup_complete or restore(), for the
    # plugin's.
    done: subprocess.CompletedProcess[str] | None = None
    with contextlib.suppress(subprocess.TimeoutExpired):  # killed at the deadline
        done = subprocess.run(
            [sys.executable, "-c", _DEADLOCK, scenario],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    if done is None:
        pytest.fail(f"deadlock: {scenario} did not finish in {DEADLINE:.0f} s")
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["calls"] > 0  # the host thread called the plugin, holding its lock
    assert got["reclaimed"] > 0 and got["credited"] == got["reclaimed"], got
    assert got["mechanism"] == ("fork" if "fork" in scenario else "stock-seam")
    assert not got["active"]


def test_a_restore_paused_after_claiming_an_undo_step_keeps_the_slot_until_it_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The undo steps run outside the lock. An operator's restore() on another thread claims
    # start-up A's fork undo and is preempted before running it; A ends meanwhile. A start-up
    # B begun then would have its install undone by A's `fork(None)` once the operator's
    # thread runs again: the slot stays A's until the claimed step ran.
    handed: list[object] = []
    use_fork_api(monkeypatch, lambda storage: handed.append(storage))
    first, second = runtime(), runtime()
    assert hook(first).mechanism == "fork"
    with restore_paused(Startup._undone.__code__):
        complete(first)  # A ends; the operator's claimed step has not run yet
        refused = hook(second)
        assert refused.reclaimed_bytes == 0 and "closing" in (refused.reason or ""), refused
    assert handed[-1] is None and Startup.active() is None  # the step ran; then the slot freed
    assert hook(second).reclaimed_bytes == CREDIT and handed[-1] is not None
    complete(second)
    assert handed[-1] is None
