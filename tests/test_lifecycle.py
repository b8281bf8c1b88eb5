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
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from support.fake_b12x import use_fork_api
from support.figures import MiB
from support.hosts import (
    CREDIT,
    JOBS,
    L2,
    PM,
    WitnessAllocatorStandIn,
    complete,
    hook,
    runtime,
    seam_is_ours,
)
from support.startups import end_any, installed, restore_paused

import flare_l2evict
from flare_l2evict import (
    L2EvictError,
    ReclaimReport,
    StartupAudit,
    _core,
    _program,
)
from flare_l2evict._b12x import seam
from flare_l2evict._errors import FallbackError
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict._startup import Startup
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator,
    ReferenceRuntime,
)

measurement = pytest.importorskip("b12x.preparation._measurement")
DEADLINE = 120.0  # seconds a child may take before the test calls it a hang
_T = TypeVar("_T")
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


@pytest.mark.slow  # a fresh interpreter that imports torch
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
_RUNTIME = Path(flare_l2evict.__file__).parent
_TRACED = frozenset(
    [str(path) for path in _RUNTIME.rglob("*.py") if _RUNTIME / "tools" not in path.parents]
    + [str(_RUNTIME / "tools" / "_choose_weights.py")]  # the tools' install, a start-up too
)
"""Every file of the runtime (what a server imports; ``tools/`` is not, but for the tools'
install): every line of them, nested functions, lambdas and comprehensions included, is a
point the sweeps stop at."""


def _traced(code: types.CodeType) -> bool:
    return code.co_filename in _TRACED


class AsynchronousInterrupt(KeyboardInterrupt):
    """What a signal handler raises, delivered at a chosen line of the hook."""


Line = tuple[str, int]
"""A runtime line: its file and its number."""


def _host(trace: Any) -> None:
    """A host's hook, then its startup_complete, under ``trace``."""
    host = runtime()
    _run_traced(functools.partial(hook, host), trace)
    _run_traced(functools.partial(complete, host), trace)


def _block(trace: Any) -> None:
    """One evicting_from block, entered and left under ``trace``."""
    tensors = {"w": torch.empty(64 * MiB // 4)}  # uninitialised: no race reads them here
    block = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    _run_traced(block.__enter__, trace)
    _run_traced(lambda: block.__exit__(None, None, None), trace)


def _under(trace: Any, call: Callable[[], _T]) -> _T:
    """``call()`` under ``trace``; tracing is off again whatever it raised."""
    sys.settrace(trace)
    try:
        return call()
    finally:
        sys.settrace(None)


def _run_traced(call: Callable[[], object], trace: Any) -> bool:
    """Run ``call`` under ``trace``; whether the armed exception interrupted it."""
    try:
        _under(trace, call)
    except AsynchronousInterrupt:
        return True
    return False


@functools.cache
def _first_hits(run: Callable[[Any], None]) -> tuple[Line, ...]:
    """Every runtime line ``run`` reaches, each once, in the order it is first reached.

    Left out, as no signal handler's exception or call can come from inside the plugin
    there: the first line of a frame the host entered (a hook, a block's enter or exit,
    ``restore()``: an exception there is raised in the host's own call, before the plugin
    ran) and ``try:`` lines (they run nothing). A ``with`` line's second event (its exit,
    bpo-29988: an exception a trace function raises there skips ``__exit__``, which a
    signal handler's cannot) is never a first hit.
    """
    order: dict[Line, None] = {}
    seen: set[Line] = set()
    fresh: dict[int, bool] = {}  # frame id -> entered by the host, until its first line

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event != "line":
            return local
        entry = fresh.pop(id(frame), False)
        line = (frame.f_code.co_filename, frame.f_lineno)
        if line not in seen:
            seen.add(line)
            text = linecache.getline(*line).lstrip()
            if not entry and not text.startswith("try:"):
                order[line] = None
        return local

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        if not _traced(frame.f_code):
            return None
        caller = frame.f_back
        fresh[id(frame)] = caller is None or not _traced(caller.f_code)
        return local

    run(None)  # one-off first lines (imports, caches) run before the count
    run(trace)
    return tuple(order)


@functools.cache
def _lines(code: types.CodeType) -> frozenset[int]:
    """The line numbers of ``code``'s own body (a nested function's are its own code's)."""
    return frozenset(line for _, _, line in code.co_lines() if line is not None)


def _at(target: Line, act: Callable[[], object]) -> tuple[Callable[..., Any], list[Line]]:
    """A trace function that runs ``act`` at the first hit of ``target``, and whether it did.

    As a signal handler would: on the start-up's own thread, between two lines. After it
    fired, nothing more is traced (what ``act`` runs included). Only a frame whose own code
    holds the target line can reach it, so only such frames are traced line by line: the
    same first hit, without a trace call per line of every other frame (most of a sweep's
    time before, in the provider's scan of ``sys.modules`` above all).
    """
    fired: list[Line] = []
    file, number = target

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line" and not fired and frame.f_lineno == number:
            fired.append(target)
            act()
        return local

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if fired or code.co_filename != file or number not in _lines(code):
            return None
        return local

    return trace, fired


def _raise(where: str) -> Callable[[], None]:
    def interrupt() -> None:
        raise AsynchronousInterrupt(where)

    return interrupt


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


def _nothing_stranded(where: str, alive: Any) -> None:
    """After a start-up's end: stock b12x, the slot and lock free, its weights collected."""
    assert installed() is None and not seam_is_ours(), where  # stock b12x bound
    assert Startup.active() is None, f"{where}: a start-up was stranded"
    assert _free_for_another_thread(), f"{where}: the lock was left held"
    for generation in (1, 2):  # the young first: a full collection takes long on torch's heap
        if not torch.UntypedStorage._expired(alive):
            gc.collect(generation)
    assert torch.UntypedStorage._expired(alive), f"{where}: the weights are still held"


def _a_fresh_start_up_credits(where: str) -> None:
    again = runtime(tensors=_AGAIN)
    assert hook(again).reclaimed_bytes == CREDIT, where
    complete(again)


_AGAIN = {"w": torch.empty(64 * MiB // 4)}  # the fresh start-up's weights, made once
_SLICES = 8  # one test per slice, each well under 30 s: the sweep never goes silent for long


def _end_of(host: weakref.ref[ReferenceRuntime]) -> None:
    """startup_complete with the host's runtime, as its signal handler would call it."""
    found = host()
    if found is not None:
        complete(found)


def _host_at(target: Line, how: str) -> None:
    """A start-up whose hook meets, at the first hit of ``target``, a signal handler that
    raises (``how = "raise"``) or calls startup_complete with the host's runtime
    (``"end"``); then its own startup_complete. The promises hold after each."""
    allocator = WitnessAllocatorStandIn(1024)
    # Uninitialised: no race reads them here, and 800 memsets of 64 MiB cost seconds.
    host = runtime(allocator=allocator, tensors={"w": torch.empty(64 * MiB // 4)})
    alive = host.tensors["w"].untyped_storage()._weak_ref()
    where = f"{how} at {target[0].rsplit('/', 2)[-1]}:{target[1]}"
    # Held weakly: a frame the trace function still marks must not keep the host alive.
    act = _raise(where) if how == "raise" else functools.partial(_end_of, weakref.ref(host))
    trace, fired = _at(target, act)
    _run_traced(functools.partial(hook, host), trace)
    assert allocator.backed in (None, True), f"{where}: a credit applied while unbacked"
    active = installed()
    if active is not None:  # kept: then credited, and backed (or a measured install)
        assert active.offered_bytes == CREDIT and seam_is_ours(), where
    elif Startup.active() is None:  # ended or restored: then stock, whatever it credited
        assert not seam_is_ours(), f"{where}: the seam stayed the plugin's after the end"
    if allocator.reclaimed_bytes and Startup.active() is not None:
        assert seam_is_ours(), f"{where}: a standing credit is not backed"
    _run_traced(functools.partial(complete, host), trace)  # ends what it made
    assert fired, f"{where}: the line was never reached"
    del host
    _nothing_stranded(where, alive)
    _a_fresh_start_up_credits(where)


@pytest.mark.slow  # a sweep: a start-up per runtime line
@pytest.mark.parametrize("how", ["raise", "end"])
@pytest.mark.parametrize("part", range(_SLICES))
def test_a_signal_at_any_runtime_line_of_a_start_up_never_strands_state(
    part: int, how: str
) -> None:
    # Issue 38: the first hit of every line of the runtime (the seam and the provider among
    # them) from before_first_capture to startup_complete's last: an exception of the
    # handler's own there, or startup_complete re-entered there, on the hook's thread.
    lines = _first_hits(_host)
    assert len(lines) > 400  # every step of the hook and of its end is traced
    seam_lines = {number for file, number in lines if file.endswith("_b12x/seam.py")}
    assert _line_of(seam._rebind, "setattr(owner, name, replacement)") in seam_lines
    for target in lines[part::_SLICES]:
        _host_at(target, how)


def _line_of(function: Callable[..., Any], text: str) -> int:
    source, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(source) if line.strip().startswith(text))


def _block_at(target: Line) -> None:
    """One block whose entry or exit meets a signal handler's exception at ``target``."""
    tensors = {"w": torch.empty(64 * MiB // 4)}
    alive = tensors["w"].untyped_storage()._weak_ref()
    block = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    where = f"raise at {target[0].rsplit('/', 2)[-1]}:{target[1]} of a block"
    trace, fired = _at(target, _raise(where))
    if not _run_traced(block.__enter__, trace):
        _run_traced(functools.partial(block.__exit__, None, None, None), trace)
    assert fired, f"{where}: the line was never reached"
    del block, tensors  # the program kept its weights for the block; its finalizer ends a
    # start-up whose exit was cut short
    _nothing_stranded(where, alive)
    with flare_l2evict.evicting_from(_AGAIN, race_jobs=JOBS, l2_cache_bytes=L2) as report:
        assert report.reclaimed_bytes == CREDIT, where  # a fresh block credits again


@pytest.mark.slow  # a sweep: a block per runtime line
@pytest.mark.parametrize("part", range(_SLICES // 2))
def test_an_asynchronous_exception_at_any_runtime_line_of_a_block_never_strands_state(
    part: int,
) -> None:
    # Both ends of a program's block: its entry, the core, its exit; after each, the
    # block's weights are collected (issue 38: a raise at the provider's version lookup
    # kept them).
    lines = _first_hits(_block)
    assert len(lines) > 300
    for target in lines[part :: _SLICES // 2]:
        _block_at(target)


def _tools_install(trace: Any) -> None:
    """The tools' install around nothing, entered and left under ``trace``."""
    from flare_l2evict._b12x.proof import measure_basis
    from flare_l2evict.tools._choose_weights import choose_weights, install

    chosen = choose_weights(_AGAIN, "cpu", MiB)
    basis = measure_basis(torch.device("cpu"), L2, flare_l2evict.L2EvictSettings(), 0)

    def held_for_a_block() -> None:
        with install(chosen, basis) as installed:
            assert installed.mechanism == "stock-seam"

    _run_traced(held_for_a_block, trace)


@pytest.mark.slow  # a sweep: an install per line
def test_a_signal_at_any_line_of_the_tools_install_never_strands_state() -> None:
    # The tools' `with install(...)`: an exception at the first hit of every line its entry
    # and its exit run (Installed, and the start-up below it) leaves the slot free and stock
    # bound, and the next start-up credits. Before, one between Startup.begin and the
    # handle's finalizer stranded the slot, one inside Startup.install before its try left
    # ENDING for ever, and one inside Installed.end() between its two steps left the seam.
    lines = _first_hits(_tools_install)
    assert len(lines) > 100
    for target in lines:
        where = f"raise at {target[0].rsplit('/', 2)[-1]}:{target[1]} of the tools' install"
        trace, fired = _at(target, _raise(where))
        # A handle whose exit was cut short ends when it is dropped, and says so: recorded.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            _tools_install(trace)
            assert fired, f"{where}: the line was never reached"
            for generation in (1, 2):
                if Startup.active() is not None:
                    gc.collect(generation)
        assert not seam_is_ours() and Startup.active() is None, where
        warned = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(warned) <= 1 and all("implicitly ended" in w for w in warned), (where, warned)
        _a_fresh_start_up_credits(where)


def test_a_restore_reentered_inside_restore_keeps_the_returned_audit_true() -> None:
    # A nested restore() dropped the step the outer one was about to drop: the outer's
    # ValueError reached startup_complete, which returned "nothing was installed".
    host = runtime()
    assert hook(host).reclaimed_bytes == CREDIT
    tracer = _call_at(Startup._undo_step, "undo.remove(step)")
    audit = _under(tracer, lambda: complete(host))
    assert tracer.fired  # type: ignore[attr-defined]
    assert audit.credited_bytes == CREDIT and audit.mechanism == "stock-seam", audit
    assert not seam_is_ours() and Startup.active() is None


def test_a_start_up_begun_inside_the_last_ones_close_keeps_its_slot() -> None:
    # A signal handler inside model A's close ends A and starts model B; A's close then
    # cleared the slot B held: B stood patched and credited with nothing able to end it.
    first, second = runtime(), runtime()
    assert hook(first).reclaimed_bytes == CREDIT
    began: list[ReclaimReport] = []

    def signal_handler() -> None:
        complete(first)
        began.append(hook(second))

    tracer = _call_at(Startup._vacate, "over and Startup._active is self", signal_handler)
    _under(tracer, lambda: complete(first))
    assert tracer.fired and began[0].reclaimed_bytes == CREDIT  # type: ignore[attr-defined]
    active = Startup.active()
    assert active is not None and active.owned_by(second) and seam_is_ours()
    assert complete(second).credited_bytes == CREDIT
    assert not seam_is_ours() and Startup.active() is None


def test_a_stale_restore_on_another_thread_never_undoes_the_next_start_ups_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An operator's restore() on another thread, preempted after it read start-up A's undo
    # steps; meanwhile A ends and B installs through the fork's API. Resumed, it ran A's
    # `fork(None)`: B stood credited with nothing installed, and its audit said nothing.
    handed: list[object] = []
    use_fork_api(monkeypatch, lambda storage: handed.append(storage))
    first, second = runtime(), runtime()
    assert hook(first).mechanism == "fork"
    restore = Startup._restore.__wrapped__  # type: ignore[attr-defined]
    with restore_paused(restore.__code__, _line_of(restore, "for step in steps:")):
        complete(first)
        assert hook(second).reclaimed_bytes == CREDIT and handed[-1] is not None
    assert handed[-1] is not None, "a stale undo of the last start-up unhooked this one"
    audit = complete(second)
    assert audit.credited_bytes == CREDIT and handed[-1] is None


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
        "eligible storage",
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
    assert type(raised.value) is FallbackError  # the one class the hook lets through
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

    use_fork_api(monkeypatch, refusing_fork_stand_in)
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


def _call_at(
    function: Callable[..., Any], text: str, call: Callable[[], object] = flare_l2evict.restore
) -> Callable[[Any, str, Any], Any]:
    """A trace function that runs ``call`` once, at ``function``'s line ``text`` (default:
    ``flare_l2evict.restore()``).

    As a signal handler would: on the start-up's own thread, under the re-entrant
    process lock where the line holds it.
    """
    code = getattr(function, "__func__", function).__code__
    lines, first = inspect.getsourcelines(code)
    target = first + next(i for i, line in enumerate(lines) if line.strip().startswith(text))
    fired: list[int] = []

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == target and not fired:
            fired.append(target)
            call()
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    tracer.fired = fired  # type: ignore[attr-defined]
    return tracer


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("core._run", "report = _report_of("),  # after the agreement, before the offer
        ("Startup.offer", "return self._step(Event.OFFER) is Phase.OFFERING"),  # its commit
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
    tracer = _call_at(function, text)
    host = runtime()
    report = _under(tracer, lambda: hook(host))
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


@pytest.mark.parametrize(
    ("text", "restore_first"),
    [
        ("setattr(owner, name, replacement)", False),
        ("undo.append(put_back)", False),
        ("setattr(owner, name, replacement)", True),
    ],
    ids=["between-register-and-change", "before-register", "restore-then-end-in-between"],
)
def test_startup_complete_mid_change_of_the_seam_leaves_stock_bound(
    text: str, restore_first: bool
) -> None:
    # Issue 38: startup_complete re-entered on the hook's thread between an undo's
    # registration and its change ran the undo first (nothing to put back), then the
    # change was made: the seam stayed the plugin's after the start-up had ended.
    host = runtime()

    def signal_handler() -> None:
        if restore_first:
            flare_l2evict.restore()
        complete(host)

    tracer = _call_at(seam._rebind, text, signal_handler)
    report = _under(tracer, lambda: hook(host))
    assert tracer.fired  # type: ignore[attr-defined]
    assert report.reclaimed_bytes == 0 and host.kv_allocator.reclaimed_bytes == 0
    assert "startup_complete ran" in (report.reason or ""), report.reason
    assert not seam_is_ours() and Startup.active() is None
    fresh = runtime()
    assert hook(fresh).reclaimed_bytes == CREDIT and seam_is_ours()
    complete(fresh)


class ProviderInterrupt(KeyboardInterrupt):
    """A signal handler's exception, raised inside the provider's version lookup."""


def test_an_exception_at_the_provider_version_lookup_leaves_no_weights_held() -> None:
    # Issue 38: raised in a block's entry at `installed_version`'s `return None` (while the lookup's
    # PackageNotFoundError is being handled), the block's weights stayed alive after the
    # block ended and after gc.collect().
    from flare_l2evict._b12x import provider

    tensors = {"w": torch.empty(64 * MiB // 4)}
    alive = tensors["w"].untyped_storage()._weak_ref()
    block = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    del tensors

    def interrupt() -> None:
        raise ProviderInterrupt("at the version lookup")

    tracer = _call_at(provider.installed_version, "return None", interrupt)
    sys.settrace(tracer)
    try:
        with pytest.raises(ProviderInterrupt), block:
            pass
    finally:
        sys.settrace(None)
    assert tracer.fired  # type: ignore[attr-defined]
    del block
    gc.collect()
    assert not seam_is_ours() and Startup.active() is None
    assert torch.UntypedStorage._expired(alive), "the block's weights are still held"


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
    with pytest.warns(ResourceWarning, match="an evicting_from block dropped before its exit"):
        with pytest.raises(Interrupt):
            with flare_l2evict.evicting_from(
                {"w": weights}, race_jobs=JOBS, l2_cache_bytes=L2
            ) as r:
                assert r.reclaimed_bytes > 0 and seam_is_ours()
                sys.settrace(tracer)
        sys.settrace(None)
        gc.collect()  # the block, whose exit never ran, ends its start-up: said, not silent
    assert fired and not seam_is_ours()
    assert installed() is None and Startup.active() is None
    with flare_l2evict.evicting_from({"w": weights}, race_jobs=JOBS, l2_cache_bytes=L2) as again:
        assert again.reclaimed_bytes > 0


class CopyingRuntimeStandIn(ReferenceRuntime):
    """A host whose resident_tensors() returns copies: installed, then credited 0 (nothing but
    the plugin holds them), so the hook's exit must restore."""

    def resident_tensors(self) -> Any:
        return {name: tensor.clone() for name, tensor in self.tensors.items()}


@pytest.mark.parametrize("text", ["if isinstance(request, Request):", "request.take_tensors()"])
def test_an_interrupt_in_the_hooks_exit_still_settles_its_start_up(text: str) -> None:
    # Issue 41: the hook's `finally` dropped the host's mapping before handing the start-up
    # back (Startup.leave). An interrupt there left an installed start-up that credited 0
    # installed, unsettled: every retry credited 0, "re-entrant call", and startup_complete
    # was the only way out. Handed back first, it is restored as the hook leaves.
    host = runtime(kind=CopyingRuntimeStandIn)

    def interrupt() -> None:
        raise AsynchronousInterrupt(f"at {text}")

    tracer = _call_at(_core.start, text, interrupt)
    with pytest.raises(AsynchronousInterrupt):
        _under(tracer, lambda: hook(host))
    assert tracer.fired  # type: ignore[attr-defined]
    assert not seam_is_ours() and installed() is None  # settled as the hook left: restored
    again = hook(host)  # held until startup_complete, as after any hook: said truly
    assert again.reclaimed_bytes == 0 and "repeated call" in (again.reason or ""), again.reason
    complete(host)
    assert Startup.active() is None
    retry = runtime()
    assert hook(retry).reclaimed_bytes == CREDIT
    complete(retry)


def _interrupted_at(function: Callable[..., Any], text: str, host: ReferenceRuntime) -> None:
    """The host's hook, cut short by an interrupt at ``function``'s line ``text``."""

    def interrupt() -> None:
        raise AsynchronousInterrupt(f"at {text}")

    tracer = _call_at(function, text, interrupt)
    with pytest.raises(AsynchronousInterrupt):
        _under(tracer, lambda: hook(host))
    assert tracer.fired  # type: ignore[attr-defined]


def test_restore_frees_a_measured_start_up_whose_hook_an_interrupt_cut_short() -> None:
    # Issue 41: interrupted after keep(), a measuring host's start-up stayed KEPT (the host
    # never got its report), and restore() left it holding the slot (CUT_SHORT): every
    # later start-up credited 0 until a startup_complete the host had no reason to call.
    host = runtime(kv_sizing="measured")
    _interrupted_at(_core._kept_for_measurement, "say(log, logging.INFO", host)
    assert seam_is_ours()  # kept: the host may still measure with the races reading weights
    flare_l2evict.restore()
    assert not seam_is_ours() and Startup.active() is None
    fresh = runtime()
    assert hook(fresh).reclaimed_bytes == CREDIT
    complete(fresh)


def test_restore_keeps_the_slot_of_a_credit_that_stands_though_its_hook_was_cut_short() -> None:
    # The credited case is not weakened: the allocator applied the credit, so restore() puts
    # stock back (SHORTFALL in the audit) but the start-up stays until startup_complete.
    host = runtime()
    _interrupted_at(_core._offer, "say(log, logging.WARNING if cut", host)
    assert host.kv_allocator.reclaimed_bytes == CREDIT and seam_is_ours()
    flare_l2evict.restore()
    assert not seam_is_ours() and Startup.active() is not None
    assert hook(runtime()).reclaimed_bytes == 0  # held until its own startup_complete
    audit = complete(host)
    assert audit.credited_bytes == CREDIT and audit.shortfall_bytes == CREDIT
    assert Startup.active() is None
