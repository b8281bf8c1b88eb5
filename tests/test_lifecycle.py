"""The start-up's lifecycle against what a host process does to it, case by case.

Case -> outcome:

- ``startup_complete(runtime=B)`` of a second model while model A starts up ->
  a no-op with one line; A's start-up, credit and eviction stand until A's own call;
- a second model's ``before_first_capture`` while A's start-up is active -> 0,
  one line naming a second model's call;
- ``os.fork()`` while another thread holds the plugin's lock -> the child's hook
  runs and credits (a real fork, with a deadline);
- a signal handler that calls ``startup_complete`` on the thread that holds the
  lock (delivered inside the hook's locked section) -> no deadlock (a real
  signal, in a child process with a deadline);
- a signal handler that calls ``startup_complete`` during ``add_reclaimed`` ->
  the credit stays backed until the allocator returns, then stock is back;
- an asynchronous exception at every line from the hook's start to its return
  -> either kept and credited, or restored and not credited; ``startup_complete``
  always ends what was installed; the next start-up credits again;
- ``async def add_reclaimed`` (a coroutine function, or an object whose
  ``__call__`` is one) -> refused before the offer, one line; never a credit;
- ``on_error = "raise"`` -> raises one line on every outcome that falls back
  except ``enabled = false`` (settings that differ across ranks: test_tp_gloo.py).
- ``add_reclaimed`` returning an awaitable -> recorded as raised (report and
  audit say RAISED), the coroutine closed, never "credited" silently;
- a ``KeyboardInterrupt`` from a runtime attribute with nothing offered -> the
  start-up ends, a retry with a fresh runtime credits.

The host's runtime and allocator are stand-ins (named so); pluggy, the
plugin, b12x's real seam, signals, fork and torch are real.
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import linecache
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from support.figures import MiB
from support.hosts import CREDIT, JOBS, L2, PM, complete, hook, runtime, seam_is_ours
from support.startups import end_any, installed

import flare_l2evict
from flare_l2evict import (
    L2EvictError,
    ReclaimReport,
    StartupAudit,
    _core,
    _eviction,
    _program,
    _read_host,
    _request,
    _startup,
    plugin,
)
from flare_l2evict._b12x import seam
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict._startup import Startup
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator,
    ReferenceRuntime,
)

measurement = pytest.importorskip("b12x.preparation._measurement")
DEADLINE = 120.0  # seconds a child may take before the test calls it a hang
RAISE = {"plugins": {"l2evict": {"on_error": "raise"}}}


# 1. A start-up belongs to its runtime.
def test_a_second_models_startup_complete_does_not_end_the_first_start_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = runtime(), runtime()
    assert hook(a).reclaimed_bytes == CREDIT
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        audit = complete(b)
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and "changed nothing" in line.getMessage()
    assert "\n" not in line.getMessage()
    assert audit.mechanism == "none" and audit.credited_bytes == 0
    # The audit a host logs says what the line says, not "nothing was installed".
    assert audit.refused and audit.summary() in line.getMessage()
    installation = installed()
    assert installation is not None and installation.offered_bytes == CREDIT
    assert seam_is_ours()  # A's races still read A's weights
    handle = measurement._l2_flush_fn(torch.device("cpu"), enabled=True)
    assert isinstance(handle, EvictionHandle) and not handle.eviction.released
    ended = complete(a)
    assert ended.credited_bytes == CREDIT and not seam_is_ours()
    assert installed() is None


def test_a_second_models_hook_while_the_first_is_active_credits_zero() -> None:
    a, b = runtime(), runtime()
    assert hook(a).reclaimed_bytes == CREDIT
    second = hook(b)
    assert second.reclaimed_bytes == 0 and "second model" in (second.reason or "")
    assert b.kv_allocator.reclaimed_bytes == 0
    assert seam_is_ours()
    complete(a)
    assert not seam_is_ours()


# 2. Fork while another thread holds the lock.
def _wait(pid: int) -> int:
    deadline = time.monotonic() + DEADLINE
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child's hook blocked for {DEADLINE:.0f} s")
        time.sleep(0.05)


def test_a_child_forked_while_another_thread_holds_the_lock_does_not_block() -> None:
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with Startup._lock:
            held.set()
            release.wait(DEADLINE)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(30)
    child_runtime = runtime()
    read, write = os.pipe()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: on purpose
            pid = os.fork()
        if pid == 0:  # the child: run the hook, write its credit, leave without pytest
            try:
                torch.set_num_threads(1)
                os.write(write, str(hook(child_runtime).reclaimed_bytes).encode())
            finally:
                os._exit(0)
    finally:
        release.set()
        holder.join()
    os.close(write)
    status = _wait(pid)
    got = os.read(read, 64).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert got == str(CREDIT)


# 3. Signal handlers that call startup_complete.
_SIGNAL_INSIDE_THE_LOCK = """
import json, os, signal, sys, torch
from flare_l2evict._startup import Startup
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator, ReferenceRuntime, plugin_manager,
)

pm = plugin_manager(["l2evict"])
runtime = ReferenceRuntime(
    device=torch.device("cpu"), config={}, kv_allocator=ReferenceKVAllocator(1024),
    race_jobs=3, l2_cache_bytes=8 << 20, tensors={"w": torch.zeros(16 << 20)},
)
audits = []
signal.signal(signal.SIGUSR1, lambda *_: audits.append(pm.hook.startup_complete(runtime=runtime)))
sent = []
BEGIN = Startup.begin.__func__.__code__
LINES = open(BEGIN.co_filename).readlines()

def trace(frame, event, arg):
    if frame.f_code is not BEGIN:
        return None
    def local(frame, event, arg):
        # Inside the locked section: a real signal, handled on this thread right here.
        text = LINES[frame.f_lineno - 1]
        if event == "line" and not sent and 'setattr(cls, "_active"' in text:
            sent.append(frame.f_lineno)
            os.kill(os.getpid(), signal.SIGUSR1)
        return local
    return local

sys.settrace(trace)
(report,) = pm.hook.before_first_capture(runtime=runtime)
sys.settrace(None)
pm.hook.startup_complete(runtime=runtime)
print(json.dumps({"sent": len(sent), "handled": len(audits), "reclaimed": report.reclaimed_bytes}))
"""


def test_a_signal_handler_calling_startup_complete_inside_the_lock_does_not_deadlock() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SIGNAL_INSIDE_THE_LOCK],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"deadlock: the hook did not return in {DEADLINE:.0f} s")
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["sent"] == 1 and got["handled"] == 1  # the handler ran, inside the lock


class SignallingAllocatorStandIn:
    """A host allocator during whose ``add_reclaimed`` a real signal arrives."""

    def __init__(self) -> None:
        self.applied = 0
        self.seam_ours_when_applied: bool | None = None

    def add_reclaimed(self, report: ReclaimReport) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)  # handled on this thread, inside this call
        self.applied += report.reclaimed_bytes
        self.seam_ours_when_applied = seam_is_ours()


@pytest.fixture
def on_sigusr1() -> Iterator[Callable[[Callable[[], None]], None]]:
    previous = signal.getsignal(signal.SIGUSR1)

    def install(action: Callable[[], None]) -> None:
        signal.signal(signal.SIGUSR1, lambda *_: action())

    yield install
    signal.signal(signal.SIGUSR1, previous)


def test_startup_complete_from_a_signal_during_add_reclaimed_waits_for_it_to_return(
    on_sigusr1: Callable[[Callable[[], None]], None],
) -> None:
    allocator = SignallingAllocatorStandIn()
    host = runtime(allocator=allocator)
    audits: list[StartupAudit] = []
    on_sigusr1(lambda: audits.append(complete(host)))
    report = hook(host)
    assert len(audits) == 1 and audits[0].credited_bytes == CREDIT
    assert report.reclaimed_bytes == CREDIT == allocator.applied
    assert allocator.seam_ours_when_applied is True  # backed while the credit was applied
    assert not seam_is_ours() and installed() is None  # then stock, once it returned


def test_a_signal_that_raises_during_add_reclaimed_keeps_the_credit_backed_until_complete(
    on_sigusr1: Callable[[Callable[[], None]], None],
) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt("from a signal handler")

    on_sigusr1(interrupt)
    host = runtime(allocator=SignallingAllocatorStandIn())
    with pytest.raises(KeyboardInterrupt):
        hook(host)
    installation = installed()
    assert installation is not None and installation.offered_bytes == CREDIT and seam_is_ours()
    assert complete(host).credited_bytes == CREDIT
    assert not seam_is_ours() and installed() is None
    assert hook(runtime()).reclaimed_bytes == CREDIT  # nothing stuck


# 4. An asynchronous exception at every point of the hook.
def _codes(owner: object) -> set[types.CodeType]:
    """The code of every function and method defined in ``owner`` (a module or a class), the
    transitions behind ``Startup``'s resuming wrapper included."""
    found: set[types.CodeType] = set()
    name = getattr(owner, "__module__", None) or getattr(owner, "__name__", "")
    for value in vars(owner).values():
        function = getattr(value, "__func__", value)
        while function is not None:
            code = getattr(function, "__code__", None)
            if code is not None and getattr(function, "__module__", None) == name:
                found.add(code)
            function = getattr(function, "__wrapped__", None)
    return found


# The start-up object, both adapters, the core, the seam and the eviction: every line.
_TRACED = set().union(
    *map(_codes, (_core, _startup, _read_host, _request, _program, plugin, seam)),
    *map(_codes, (Startup, _program._Block, seam.StockSeam, seam.Seam, _eviction.WeightEviction)),
)


class AsynchronousInterrupt(KeyboardInterrupt):
    """What a signal handler raises, delivered at a chosen line of the hook."""


def _leaving_a_with(frame: types.FrameType, entered: set[tuple[int, int]]) -> bool:
    """Whether this line event is a ``with`` statement's exit (its line, seen again).

    CPython reports the exit of a ``with`` block as a second event on its line,
    before ``__exit__`` runs and outside the block's exception handler, so an
    exception a trace function raises there skips ``__exit__`` (bpo-29988). A
    signal handler cannot raise there: CPython runs them at calls and backward
    jumps, inside the block. So the test raises on entry, never on that event.
    """
    key = (id(frame), frame.f_lineno)
    if (id(frame), -1) not in entered:
        entered.add((id(frame), -1))
        caller = frame.f_back
        if caller is None or caller.f_code not in _TRACED:
            # The first line of an entry (a hook, a block's enter or exit, restore()): an
            # exception there is one raised in the host's own call, before the plugin ran.
            return True
    line = [linecache.getline(frame.f_code.co_filename, frame.f_lineno)]
    if line[0].lstrip().startswith("try:"):
        # A ``try:`` line runs nothing (no point a signal handler runs at); an exception
        # there is one before the function's first line, i.e. before the hook was called.
        return True
    if not line[0].lstrip().startswith("with "):
        return False
    if key in entered:
        return True
    entered.add(key)
    return False


def _forget_on_return(frame: types.FrameType, event: str, entered: set[tuple[int, int]]) -> None:
    """A frame that returns (or unwinds) forgets its ``with`` lines: its id may be reused."""
    if event == "return":
        entered.difference_update({key for key in entered if key[0] == id(frame)})


def _interrupt_at(point: int) -> Callable[[types.FrameType, str, Any], Any]:
    """A trace function that raises at the ``point``-th line the hook's steps run (0: never)."""
    seen = 0
    entered: set[tuple[int, int]] = set()

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal seen
        _forget_on_return(frame, event, entered)
        if event == "line" and not _leaving_a_with(frame, entered):
            seen += 1
            if seen == point:
                raise AsynchronousInterrupt(f"at line {frame.f_lineno} of {frame.f_code.co_name}")
        return local

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code in _TRACED else None

    return trace


def _host(trace: Any) -> bool:
    """A host's hook, then its startup_complete, under ``trace``; whether it was interrupted."""
    host = runtime()
    return _run_traced(functools.partial(hook, host), trace) | _run_traced(
        functools.partial(complete, host), trace
    )


def _lines_run(run: Callable[[Any], bool] = _host) -> int:
    """How many traced lines ``run`` runs (its first, one-off lines run before the count)."""
    count = 0
    entered: set[tuple[int, int]] = set()

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        _forget_on_return(frame, event, entered)
        count += event == "line" and not _leaving_a_with(frame, entered)
        return local

    run(None)
    run(lambda frame, event, arg: local if frame.f_code in _TRACED else None)
    return count


def _free_for_another_thread() -> bool:
    got: list[bool] = []

    def take() -> None:
        got.append(Startup._lock.acquire(timeout=10))
        if got[0]:
            Startup._lock.release()

    other = threading.Thread(target=take)
    other.start()
    other.join()
    return got == [True]


def _run_traced(call: Callable[[], object], trace: Any) -> bool:
    """Run ``call`` under ``trace``; whether the armed exception interrupted it."""
    sys.settrace(trace)
    try:
        call()
    except AsynchronousInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


@functools.cache
def _points() -> int:
    """How many traced lines one start-up runs, hook and startup_complete (counted once)."""
    return _lines_run()


_SLICES = 8  # one test per slice, each well under 30 s: the sweep never goes silent for long


def _interrupt_and_check(point: int) -> bool:
    """Interrupt a start-up at traced line ``point``; the four promises hold after it."""
    allocator = ReferenceKVAllocator(1024)
    # Uninitialised: no race reads them here, and 500 memsets of 64 MiB cost seconds.
    host = runtime(allocator=allocator, tensors={"w": torch.empty(64 * MiB // 4)})
    alive = host.tensors["w"].untyped_storage()._weak_ref()
    trace = _interrupt_at(point)  # one count over the hook, then startup_complete
    where = f"interrupted at traced line {point}"
    interrupted = _run_traced(functools.partial(hook, host), trace)
    if interrupted:
        kept = installed()
        if kept is not None:  # kept: then credited, and backed
            assert kept.offered_bytes == CREDIT and seam_is_ours(), where
        else:  # restored: then never credited
            assert allocator.reclaimed_bytes == 0 and not seam_is_ours(), where
    interrupted |= _run_traced(functools.partial(complete, host), trace)  # ends what it made
    assert installed() is None and not seam_is_ours(), where  # stock b12x bound
    assert Startup.active() is None, f"{where}: a start-up was stranded"
    assert _free_for_another_thread(), f"{where}: the lock was left held"
    del host
    if not torch.UntypedStorage._expired(alive):
        gc.collect()  # only when needed: a full collection takes long on torch's heap
    assert torch.UntypedStorage._expired(alive), f"{where}: the weights are still held"
    again = runtime(tensors=_AGAIN)
    assert hook(again).reclaimed_bytes == CREDIT, where  # a fresh start-up credits again
    complete(again)
    return interrupted


_AGAIN = {"w": torch.empty(64 * MiB // 4)}  # the fresh start-up's weights, made once


@pytest.mark.parametrize("part", range(_SLICES))
def test_an_asynchronous_exception_anywhere_never_strands_state(part: int) -> None:
    # Every line of both adapters, the core, the start-up object, the seam and the eviction
    # (issue 34), from before_first_capture's first line to startup_complete's last.
    points = _points()
    assert points > 80  # every step of the hook and of its end is traced
    mine = range(1 + part, points + 1, _SLICES)
    assert all(_interrupt_and_check(point) for point in mine)


def _block(trace: Any) -> bool:
    """One evicting_from block, entered and left under ``trace``; whether it was interrupted."""
    tensors = {"w": torch.empty(64 * MiB // 4)}  # uninitialised: no race reads them here
    block = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    interrupted = _run_traced(block.__enter__, trace) or _run_traced(
        lambda: block.__exit__(None, None, None), trace
    )
    _DONE.append(block)  # its finalizer runs outside the trace, whatever else runs meanwhile
    return interrupted


_DONE: list[object] = []


@functools.cache
def _block_points() -> int:
    points = _lines_run(_block)
    _DONE.clear()
    return points


@pytest.mark.parametrize("part", range(_SLICES // 2))
def test_an_asynchronous_exception_anywhere_in_a_block_never_strands_state(part: int) -> None:
    # Both ends of a program's block (issue 34): its entry, the core, its exit.
    points = _block_points()
    assert points > 60
    for point in range(1 + part, points + 1, _SLICES // 2):
        where = f"interrupted at traced line {point} of a block"
        assert _block(_interrupt_at(point)), where
        _DONE.clear()
        assert not seam_is_ours() and Startup.active() is None, where
        assert _free_for_another_thread(), f"{where}: the lock was left held"
        with flare_l2evict.evicting_from(_AGAIN, race_jobs=JOBS, l2_cache_bytes=L2) as report:
            assert report.reclaimed_bytes == CREDIT, where  # a fresh block credits again


# 5. An allocator whose add_reclaimed is a coroutine function.
class AsyncAllocatorStandIn:
    def __init__(self) -> None:
        self.awaited = False

    async def add_reclaimed(self, report: ReclaimReport) -> None:
        self.awaited = True


class AsyncCallStandIn:
    async def __call__(self, report: ReclaimReport) -> None:
        raise AssertionError("never called")


class AsyncCallableAllocatorStandIn:
    add_reclaimed = AsyncCallStandIn()


@pytest.mark.parametrize(
    "allocator",
    [AsyncAllocatorStandIn(), AsyncCallableAllocatorStandIn()],
    ids=["async-def", "async-__call__"],
)
def test_an_async_add_reclaimed_is_refused_before_the_offer(
    allocator: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="flare_l2evict"), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        report = hook(runtime(allocator=allocator))
    assert report.reclaimed_bytes == 0 and "coroutine function" in (report.reason or "")
    assert installed() is None and not seam_is_ours()
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and "async def" in line.getMessage()
    end_any()
    with pytest.raises(L2EvictError, match="coroutine function"):
        hook(runtime(allocator=allocator, config=RAISE))


# 6. on_error = "raise" raises on every outcome that falls back.
class EndingMappingStandIn(dict[str, torch.Tensor]):
    """The host's resident tensors, whose first iteration ends the start-up (as another thread's
    startup_complete would, while the plugin reads the mapping)."""

    def __iter__(self) -> Iterator[str]:
        end_any()  # startup_complete, while the hook runs
        return super().__iter__()


def _ends_itself_during_the_hook() -> ReferenceRuntime:
    class EndingRuntimeStandIn(ReferenceRuntime):
        def resident_tensors(self) -> Any:
            return EndingMappingStandIn(super().resident_tensors())

    base = runtime(config=RAISE)
    return EndingRuntimeStandIn(**{k: getattr(base, k) for k in base.__dataclass_fields__})


FALLBACKS: dict[str, tuple[Callable[[], ReferenceRuntime], str]] = {
    "no-storage-covers-the-window": (
        lambda: runtime(nbytes=MiB, config=RAISE),
        "eligible storages hold",
    ),
    "exclude-matches-every-tensor": (
        lambda: runtime(config={"plugins": {"l2evict": {"on_error": "raise", "exclude": ["*"]}}}),
        "eligible",
    ),
    "race-jobs-0": (lambda: runtime(config=RAISE, race_jobs=0), "0 race jobs"),
    "startup-complete-during-the-hook": (_ends_itself_during_the_hook, "startup_complete ran"),
}


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_on_error_raise_raises_on_every_fallback(case: str) -> None:
    make, cause = FALLBACKS[case]
    host = make()
    with pytest.raises(L2EvictError, match="on_error = 'raise'") as raised:
        hook(host)
    assert cause in str(raised.value) and "\n" not in str(raised.value)
    assert host.kv_allocator.reclaimed_bytes == 0
    assert installed() is None and not seam_is_ours()


def test_on_error_raise_raises_on_a_refused_repeated_call_and_keeps_the_first() -> None:
    host = runtime(config=RAISE)
    assert hook(host).reclaimed_bytes == CREDIT
    with pytest.raises(L2EvictError, match=r"on_error = 'raise'.*repeated call") as raised:
        hook(host)
    assert "\n" not in str(raised.value)
    assert host.kv_allocator.reclaimed_bytes == CREDIT and seam_is_ours()  # the first stands


def test_on_error_raise_does_not_raise_when_disabled() -> None:
    host = runtime(config={"plugins": {"l2evict": {"on_error": "raise", "enabled": False}}})
    report = hook(host)
    assert report.reclaimed_bytes == 0 and "enabled = false" in (report.reason or "")


def test_a_start_up_disabled_by_config_logs_one_info_line_and_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 29: enabled = false is the operator's choice; a WARNING at every start-up
    # would page someone for a deliberate setting.
    host = runtime(config={"plugins": {"l2evict": {"enabled": False}}})
    with caplog.at_level(logging.DEBUG, logger="flare_l2evict"):
        report = hook(host)
        complete(host)
    assert report.reclaimed_bytes == 0 and "enabled = false" in (report.reason or "")
    ours = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert [r.levelno for r in ours if "enabled = false" in r.getMessage()] == [logging.INFO]
    assert not [r for r in ours if r.levelno >= logging.WARNING], [r.getMessage() for r in ours]


def test_a_start_up_that_fell_back_keeps_no_host_object_alive() -> None:
    import gc

    host = runtime(nbytes=MiB)  # too few bytes: falls back
    alive = host.tensors["model.layers.0.mlp.experts.w13_weight"].untyped_storage()._weak_ref()
    assert hook(host).reclaimed_bytes == 0
    del host
    gc.collect()
    assert torch.UntypedStorage._expired(alive)  # the start-up holds its runtime weakly
    assert hook(runtime()).reclaimed_bytes == 0  # the start-up is still active ...
    complete(
        runtime()
    )  # ... until startup_complete, which anyone may call once its runtime is gone
    fresh = runtime()
    assert hook(fresh).reclaimed_bytes == CREDIT
    complete(fresh)


# 7. A credit offered is ended only by the start-up that offered it (issue 28).
def test_a_credited_start_up_outlives_its_runtime_object_and_ends_by_its_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    allocator = ReferenceKVAllocator(1024)
    tensors = {"model.layers.0.mlp.experts.w13_weight": torch.zeros(64 * MiB // 4)}
    made_for_the_call = runtime(allocator=allocator)
    made_for_the_call.tensors = tensors
    report = hook(made_for_the_call)
    assert report.reclaimed_bytes == CREDIT == allocator.reclaimed_bytes
    del made_for_the_call
    gc.collect()  # model A's runtime object is gone; its credit stands
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        assert complete(runtime()).credited_bytes == 0  # model B's call
        assert complete(None).credited_bytes == 0  # startup_complete(runtime=None)
    assert seam_is_ours() and installed() is not None  # A's races still read A's
    lines = [r.getMessage() for r in caplog.records if r.name == "flare_l2evict"]
    assert len(lines) == 2 and all("changed nothing" in line for line in lines)
    assert all(f"credit of {CREDIT:,} bytes stands" in line for line in lines)
    ended = complete(report)  # the documented way: the report before_first_capture returned
    assert ended.credited_bytes == CREDIT and not seam_is_ours()
    assert installed() is None
    fresh = runtime()
    assert hook(fresh).reclaimed_bytes == CREDIT
    complete(fresh)


def test_restore_while_the_credit_stands_is_audited_as_shortfall(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import flare_l2evict

    host = runtime()
    assert hook(host).reclaimed_bytes == CREDIT
    flare_l2evict.restore()  # an operator's, or the allocator's own, after the credit
    assert not seam_is_ours() and installed() is None
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        audit = complete(host)
    assert audit.credited_bytes == CREDIT and audit.shortfall_bytes == CREDIT and audit.warns
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and f"SHORTFALL {CREDIT:,} bytes" in line.getMessage()
    assert "restore() ran before startup_complete" in line.getMessage()


def test_startup_complete_never_raises_when_the_fork_refuses_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    handed: list[object] = []

    def refusing_fork_stand_in(storage: object) -> None:
        if storage is None:
            raise ValueError("use_startup_eviction(None): no storage to restore")
        handed.append(storage)

    fork_stand_in = types.ModuleType("b12x.comm.pcie")
    fork_stand_in.use_startup_eviction = refusing_fork_stand_in  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "b12x.comm.pcie", fork_stand_in)
    host = runtime()
    assert hook(host).mechanism == "fork" and handed
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        audit = complete(host)  # must not raise
    assert audit.mechanism == "fork" and installed() is None
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and "RESTORE FAILED: ValueError" in line.getMessage()


# 8. A host's allocator or runtime that breaks the contract mid-hook.
class AwaitableAllocatorStandIn(ReferenceKVAllocator):
    """An allocator whose plain ``add_reclaimed`` returns a coroutine it never awaits."""

    def __init__(self) -> None:
        super().__init__(1024)
        self.add_reclaimed = self._returns_coroutine  # type: ignore[method-assign]

    def _returns_coroutine(self, report: flare_l2evict.ReclaimReport) -> Any:
        async def apply() -> None:
            self.reclaimed_bytes += report.reclaimed_bytes

        return apply()


def test_an_allocator_returning_an_awaitable_is_recorded_as_raised() -> None:
    allocator = AwaitableAllocatorStandIn()
    host = runtime(128 * MiB, allocator=allocator, race_jobs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... never awaited"
        (report,) = PM.hook.before_first_capture(runtime=host)
        audit = PM.hook.startup_complete(runtime=host)[0]
    assert allocator.reclaimed_bytes == 0
    assert (report.allocator_error or "").startswith("RuntimeContractError: kv_allocator")
    assert "returned coroutine (an awaitable)" in (report.allocator_error or "")
    assert "RAISED" in audit.summary()


class InterruptingRuntimeStandIn(ReferenceRuntime):
    """A host whose ``race_jobs`` property raises ``KeyboardInterrupt`` (Ctrl-C mid-hook)."""

    @property
    def race_jobs(self) -> int:
        raise KeyboardInterrupt

    @race_jobs.setter
    def race_jobs(self, _value: int) -> None:
        pass


def test_an_interrupt_with_nothing_offered_lets_a_fresh_runtime_start() -> None:
    broken = runtime(128 * MiB, race_jobs=2, kind=InterruptingRuntimeStandIn)
    with pytest.raises(KeyboardInterrupt):
        PM.hook.before_first_capture(runtime=broken)
    retry = runtime(128 * MiB, race_jobs=2)
    (report,) = PM.hook.before_first_capture(runtime=retry)
    assert report.reclaimed_bytes > 0, report.reason
    assert retry.kv_allocator.reclaimed_bytes == report.reclaimed_bytes


# restore() and the block's exit at the lines the re-attack found (issue 28).


def _restore_at(function: Callable[..., Any], text: str) -> Callable[[Any, str, Any], Any]:
    """A trace function that runs ``flare_l2evict.restore()`` once, at ``function``'s line ``text``.

    As an operator's signal handler would: on the start-up's own thread, under
    the re-entrant process lock where the line holds it.
    """
    code = getattr(function, "__func__", function).__code__
    lines, first = inspect.getsourcelines(code)
    target = first + next(i for i, line in enumerate(lines) if line.strip().startswith(text))
    fired: list[int] = []

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == target and not fired:
            fired.append(target)
            flare_l2evict.restore()
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    tracer.fired = fired  # type: ignore[attr-defined]
    return tracer


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("core._run", "report = _report_of("),  # after the agreement, before the offer
        ("Startup.offer", "if self._move(Phase.INSTALLED, Phase.OFFERING):"),  # its commit
        ("Startup.install", "seam.install(eviction, self._undo)"),  # b12x not changed yet
        ("seam._rebind", "setattr(owner, name, replacement)"),  # mid-patch
    ],
)
def test_a_restore_during_the_hook_never_leaves_a_credit_unbacked_or_the_seam_patched(
    where: str, text: str
) -> None:
    function: Callable[..., Any] = {  # type: ignore[assignment]
        "core._run": _core._run,
        "Startup.offer": Startup.offer,
        "Startup.install": Startup.install,
        "seam._rebind": seam._rebind,
    }[where]
    tracer = _restore_at(function, text)
    host = runtime()
    sys.settrace(tracer)
    try:
        report = hook(host)
    finally:
        sys.settrace(None)
    assert tracer.fired, f"{where}: the line {text!r} never ran"  # type: ignore[attr-defined]
    granted = host.kv_allocator.reclaimed_bytes
    backed = seam_is_ours()
    audit = complete(host)
    # The credit the allocator holds is backed by the seam, or the audit names it in full.
    assert granted == report.reclaimed_bytes
    assert not granted or backed or audit.shortfall_bytes == granted, (where, granted, audit)
    if not granted:
        assert "restore()" in (report.reason or ""), report.reason
    assert not seam_is_ours() and installed() is None and Startup.active() is None
    fresh = runtime()
    assert hook(fresh).reclaimed_bytes > 0 and seam_is_ours()
    complete(fresh)


def test_an_exception_at_the_entry_of_a_blocks_exit_still_ends_its_start_up() -> None:
    # A signal handler's exception can land as __exit__ is entered, before any of its
    # lines; the with statement then drops the block, and its start-up still ends.
    class Interrupt(KeyboardInterrupt):
        pass

    exit_code = _program._Block.__exit__.__code__
    fired: list[bool] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is exit_code and not fired:
            fired.append(True)
            raise Interrupt
        return None

    weights = torch.zeros(64 * MiB // 4)
    with pytest.raises(Interrupt):
        with flare_l2evict.evicting_from({"w": weights}, race_jobs=JOBS, l2_cache_bytes=L2) as r:
            assert r.reclaimed_bytes > 0 and seam_is_ours()
            sys.settrace(tracer)
    sys.settrace(None)
    gc.collect()
    assert fired and not seam_is_ours()
    assert installed() is None and Startup.active() is None
    with flare_l2evict.evicting_from({"w": weights}, race_jobs=JOBS, l2_cache_bytes=L2) as again:
        assert again.reclaimed_bytes > 0
