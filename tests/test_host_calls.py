"""What a host's code does when the plugin calls it, or when it calls the plugin, and the
outcome: one credit at a time, always backed until ``startup_complete``.

The host's runtime and allocator are code the plugin does not own, so they are stand-ins here
(named so: ``support/hostile.py``'s, or one per case); pluggy, the plugin, b12x's real seam
and torch are real. What the runtime's values may be is in ``test_host_values.py``; who ends
a start-up (a second model, a signal handler) in ``test_who_ends_a_start_up.py``; ``restore()``
and forks in ``test_undo_and_fork.py``; a signal at every line in ``test_every_line.py``.

Behaviour -> outcome:

- the allocator applies the credit, then raises (or raises before applying) -> the credit
  stays backed: the eviction is kept until ``startup_complete``; report and audit say it
  raised; under ``on_error = "raise"`` it raises and keeps the eviction;
- ``KeyboardInterrupt`` or ``SystemExit`` from ``add_reclaimed`` -> propagates; eviction
  kept; the audit records it; a ``BaseException`` before the offer -> propagates; nothing
  installed;
- the allocator re-enters ``before_first_capture`` -> the inner call credits 0 and touches
  nothing; the same runtime's hook twice -> 0, naming what is active, until its
  ``startup_complete``; two threads at once -> one credit in all;
- the host ends and restarts start-up inside the hook -> the new start-up keeps its credit;
  ``startup_complete`` during the offer -> carried out once ``add_reclaimed`` returned (one
  WARNING that says whether it came inside the call or before it); an installation made
  before the hook -> never credited;
- the hook under ``torch.inference_mode()``, races outside -> races run (torch read here,
  Triton on a GPU in ``test_gpu_host.py``); a log handler that raises -> neither hook breaks;
- fewer evictions alive at once than ``race_jobs`` -> an audit WARNING naming the bytes; a
  race job that keeps its eviction past ``startup_complete`` -> the weights are freed;
- a hook while an ``evicting_from`` block or a tools install is active -> 0, the reason
  naming which;
- ``async def add_reclaimed`` (a coroutine function, or an object whose ``__call__`` is one),
  or a generator function -> refused before the offer, one line; never a credit; a plain
  ``add_reclaimed`` returning an awaitable -> recorded as raised (report and audit say
  RAISED), the coroutine closed, never "credited" silently;
- a ``KeyboardInterrupt`` from a runtime attribute with nothing offered -> the start-up ends,
  a retry with a fresh runtime credits;
- host code (attributes, the mapping, tensor methods, the allocator, torch modes, a log
  handler, ``__del__``, the fork's API, an exception's ``__str__``) -> never runs under the
  plugin's lock; a profiler's mode that takes a host lock, and a host thread holding it that
  calls ``startup_complete`` or ``restore()`` -> both finish (a child process with a
  deadline);
- any mix of allocator behaviours and raising attributes, on threads (a property test), in a
  process that imported Triton or not -> at most one credit, always backed until
  ``startup_complete``; Triton's flush beside a credit, and stock after the end.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from support.fake_b12x import use_fork_api
from support.figures import MiB
from support.hostile import (
    HostileAllocatorStandIn,
    HostileRuntimeStandIn,
    aliases,
    hostile,
)
from support.hosts import (
    CREDIT,
    JOBS,
    L2,
    PM,
    STOCK_BUFFER,
    complete,
    hook,
    runtime,
    seam_is_ours,
    weights,
)
from support.startups import end_any, installed
from support.stops import Stop, at
from support.sums import checksum
from support.triton_stand_in import TritonModulesStandIn, triton_imported
from support.watched import (
    AppliesThenRaisesHostErrorStandIn,
    HostErrorStandIn,
    Seen,
    WatchedAllocatorStandIn,
    WatchedTensorStandIn,
    WatchedUseRuntimeStandIn,
    lock_held_here,
    watched_host,
    watching,
)

import flare_l2evict
from flare_l2evict import L2EvictError, ReclaimReport, StartupAudit
from flare_l2evict._b12x.proof import measure_basis
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict._settings import L2EvictSettings
from flare_l2evict._startup import Startup
from flare_l2evict.hookspecs import RUNTIME_ATTRIBUTES
from flare_l2evict.tools._choose_weights import choose_weights, install
from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime

measurement = pytest.importorskip("b12x.preparation._measurement")
ATTRIBUTES = RUNTIME_ATTRIBUTES
DEADLINE = 120.0  # seconds a child may take before the test calls it a deadlock
RAISE = {"plugins": {"l2evict": {"on_error": "raise"}}}


# An allocator that raises: the credit stays backed.
@pytest.mark.parametrize("mode", ["apply-then-raise", "raise-before"])
def test_an_allocator_that_raises_keeps_the_eviction_until_startup_complete(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = hostile(mode)
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(runtime)
    assert report.reclaimed_bytes == CREDIT
    assert report.allocator_error is not None and "allocator" in report.allocator_error
    assert runtime.kv_allocator.applied == (CREDIT if mode == "apply-then-raise" else 0)
    installation = installed()
    assert installation is not None and installation.offered_bytes == CREDIT
    assert seam_is_ours()
    assert isinstance(measurement._l2_flush_fn(torch.device("cpu"), enabled=True), EvictionHandle)
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and "RAISED" in line.getMessage()
    audit = end_any()
    assert audit.allocator_error is not None and "RAISED" in audit.summary()
    assert not seam_is_ours()


def test_an_allocator_that_raises_under_on_error_raise_raises_but_keeps_the_eviction() -> None:
    runtime = hostile("apply-then-raise", config={"plugins": {"l2evict": {"on_error": "raise"}}})
    with pytest.raises(L2EvictError, match=r"add_reclaimed raised.*stays installed"):
        hook(runtime)
    assert runtime.kv_allocator.applied == CREDIT
    assert seam_is_ours()  # the credit may have been applied
    end_any()
    assert not seam_is_ours()


@pytest.mark.parametrize(("mode", "kind"), [("keyboard", KeyboardInterrupt), ("exit", SystemExit)])
def test_a_base_exception_from_the_allocator_propagates_and_keeps_the_backing(
    mode: str, kind: type[BaseException]
) -> None:
    runtime = hostile(mode)
    with pytest.raises(kind):
        hook(runtime)
    assert runtime.kv_allocator.applied == CREDIT
    assert seam_is_ours()
    audit = end_any()
    assert audit.allocator_error is not None and kind.__name__ in audit.allocator_error
    assert audit.credited_bytes == CREDIT
    assert not seam_is_ours()


def test_a_base_exception_before_the_offer_leaves_nothing_installed() -> None:
    class InterruptedTensorsStandIn(dict[str, torch.Tensor]):
        def __iter__(self) -> Iterator[str]:
            raise KeyboardInterrupt

    runtime = hostile(tensors=InterruptedTensorsStandIn(weights()))
    with pytest.raises(KeyboardInterrupt):
        hook(runtime)
    assert installed() is None and not seam_is_ours()
    assert runtime.kv_allocator.applied == 0


# One credit at a time.
def test_an_allocator_that_re_enters_the_hook_gets_one_credit() -> None:
    runtime = hostile("re-enter")
    report = hook(runtime)
    assert report.reclaimed_bytes == CREDIT
    (inner,) = runtime.kv_allocator.inner
    assert inner.reclaimed_bytes == 0 and "re-entrant call" in inner.reason
    assert runtime.kv_allocator.applied == CREDIT  # the inner call touched no allocator


def test_hook_twice_credits_once() -> None:
    host_runtime = runtime(tensors={"w": torch.zeros(64 * MiB // 4)})
    first = hook(host_runtime)
    seam = measurement._l2_flush_fn
    second = hook(host_runtime)
    assert first.reclaimed_bytes == CREDIT
    assert second.reclaimed_bytes == 0 and second.reason is not None
    assert "repeated call" in second.reason
    assert "Startup(stock-seam, 'w' on cpu" in second.reason  # names what is active
    assert measurement._l2_flush_fn is seam
    assert host_runtime.kv_allocator.reports == [first]  # the second touched no allocator
    PM.hook.startup_complete(runtime=host_runtime)
    third = hook(host_runtime)  # a new start-up may begin
    assert third.reclaimed_bytes == first.reclaimed_bytes


def test_two_threads_at_once_make_one_credit() -> None:
    # The host's code (resident_tensors() included) runs before a start-up begins, so a
    # slow host cannot hold the first call inside its start-up; the first thread pauses
    # right after it took the process's slot instead, until the second call returned.
    runtimes = [hostile(), hostile()]
    reports: list[ReclaimReport] = []
    first_began, second_done = threading.Event(), threading.Event()

    def pause_once_begun() -> None:
        first_began.set()
        second_done.wait(30)

    def first() -> None:
        stop = Stop(at(Startup.begin, event="return"), pause_once_begun)
        stop.run(lambda: reports.append(hook(runtimes[0])))

    def second() -> None:
        try:
            if first_began.wait(30):
                reports.append(hook(runtimes[1]))
        finally:
            second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert first_began.is_set()
    assert sorted(r.reclaimed_bytes for r in reports) == [0, CREDIT]
    refused = next(r for r in reports if r.reclaimed_bytes == 0)
    assert "concurrent call" in (refused.reason or "")
    assert sum(r.kv_allocator.applied for r in runtimes) == CREDIT


def test_a_host_that_ends_and_restarts_start_up_inside_the_hook_keeps_the_new_credit() -> None:
    second = hostile()

    class RestartingRuntimeStandIn(HostileRuntimeStandIn):
        def resident_tensors(self) -> Any:
            PM.hook.startup_complete(runtime=self)  # ends this start-up ...
            hook(second)  # ... and a second one credits and installs
            raise RuntimeError("first start-up's tensors are gone")

    first = RestartingRuntimeStandIn(HostileAllocatorStandIn(), weights())
    assert hook(first).reclaimed_bytes == 0
    assert second.kv_allocator.applied == CREDIT
    assert seam_is_ours()  # the first start-up's fault did not take the second's backing
    installation = installed()
    assert installation is not None and installation.offered_bytes == CREDIT


def test_startup_complete_during_the_offer_waits_for_add_reclaimed_to_return() -> None:
    seen: list[bool] = []

    class FinishingAllocatorStandIn(HostileAllocatorStandIn):
        def add_reclaimed(self, report: ReclaimReport) -> None:
            other = threading.Thread(target=end_any)  # startup_complete, concurrently
            other.start()
            other.join()
            self.applied += report.reclaimed_bytes
            seen.append(seam_is_ours())  # still backed while the credit is applied

    runtime = HostileRuntimeStandIn(FinishingAllocatorStandIn(), weights())
    assert hook(runtime).reclaimed_bytes == CREDIT
    assert seen == [True]
    assert not seam_is_ours()  # start-up was over: restored once the offer returned


def test_startup_complete_between_the_offer_and_add_reclaimed_is_told_as_before_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 46: the WARNING said startup_complete "ran inside kv_allocator.add_reclaimed"
    # when it ran before the call (another thread's, here just after the credit was recorded).
    from flare_l2evict import _core

    ended: list[StartupAudit] = []

    def end_on_another_thread() -> None:
        other = threading.Thread(target=lambda: ended.append(end_any()))
        other.start()
        other.join()

    runtime = hostile()
    stop = Stop(at(_core._offer, "raised: BaseException"), end_on_another_thread)
    with caplog.at_level(logging.WARNING, logger="flare_l2evict"):
        assert stop.run(lambda: hook(runtime)).reclaimed_bytes == CREDIT
    assert runtime.kv_allocator.applied == CREDIT and stop.fired
    assert ended and ended[0].credited_bytes == CREDIT and not seam_is_ours()
    (line,) = [r.getMessage() for r in caplog.records if "during the offer" in r.getMessage()]
    assert (
        "startup_complete ran after the credit was recorded but before "
        "kv_allocator.add_reclaimed was called" in line
    ), line
    assert "inside" not in line and "once before_first_capture has returned" in line, line


def test_an_installation_made_before_the_hook_is_never_credited() -> None:
    tiny = choose_weights({"tiny": torch.zeros(MiB // 4)}, "cpu", MiB)
    settings = L2EvictSettings.model_construct(window=MiB)
    with install(tiny, measure_basis(tiny.device, MiB, settings, 0)) as earlier:
        runtime = hostile()
        report = hook(runtime)
        assert report.reclaimed_bytes == 0 and "while a start-up is active" in (report.reason or "")
        assert runtime.kv_allocator.applied == 0
        assert installed() is earlier.startup  # left as it was


@pytest.mark.parametrize("active", ["an evicting_from block", "a tools install"])
def test_a_flare_hook_during_a_block_or_a_tools_install_is_named_truly(active: str) -> None:
    # Issue 41: a host's hook during an open block was refused as "a second model's call",
    # and during a tools install as a "re-entrant call (from inside this start-up's own hook)".
    from flare_l2evict._b12x.proof import measure_basis
    from flare_l2evict.tools._choose_weights import choose_weights, install

    tensors = weights()
    opened: Any
    if active == "an evicting_from block":
        opened = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    else:
        basis = measure_basis(torch.device("cpu"), L2, flare_l2evict.L2EvictSettings(), 0)
        opened = install(choose_weights(tensors, "cpu", MiB), basis)
    host = runtime()
    with opened:
        report = hook(host)
    reason = report.reason or ""
    assert report.reclaimed_bytes == 0 and host.kv_allocator.reclaimed_bytes == 0
    assert reason.startswith(f"a flare host's hook ({active} is active)"), reason
    assert "second model" not in reason and "re-entrant" not in reason, reason


# The host's surroundings: inference mode, its log handlers.
def test_races_outside_inference_mode_use_an_eviction_made_inside_it() -> None:
    runtime = hostile()
    with torch.inference_mode():
        runtime.tensors = weights()  # loaded under inference mode, as many hosts do
        report = hook(runtime)
    assert report.reclaimed_bytes == CREDIT and report.read_kernel == "torch"
    eviction = measurement._l2_flush_fn(torch.device("cpu"), enabled=True)
    eviction()  # would raise "Inplace update to inference tensor outside InferenceMode"
    eviction()
    assert isinstance(eviction, EvictionHandle) and checksum(eviction.eviction) == 0.0


class DownLogSinkStandIn(logging.Handler):
    """A host log handler whose sink is down."""

    def emit(self, record: logging.LogRecord) -> None:
        raise OSError("log sink down")


@pytest.mark.parametrize("race_jobs", [JOBS, -1], ids=["credited", "contract-error"])
def test_a_log_handler_that_raises_breaks_neither_hook(race_jobs: int) -> None:
    handler = DownLogSinkStandIn()
    logging.getLogger("flare_l2evict").addHandler(handler)
    try:
        runtime = hostile(race_jobs_=race_jobs)
        report = hook(runtime)
        assert report.reclaimed_bytes == (CREDIT if race_jobs > 0 else 0)
        assert seam_is_ours() == (race_jobs > 0)
        end_any()
        assert not seam_is_ours()
    finally:
        logging.getLogger("flare_l2evict").removeHandler(handler)


# The races: the audit holds race_jobs to the evictions alive at once; nothing held after.
def test_fewer_evictions_alive_than_race_jobs_is_a_warning_in_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook(hostile())
    for _ in range(JOBS):  # one job at a time: each drops its eviction before the next
        measurement._l2_flush_fn(torch.device("cpu"), enabled=True)()
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        audit = end_any()
    assert audit.peak_alive == 1 and audit.race_jobs == JOBS
    assert audit.unused_credit_bytes == (JOBS - 1) * STOCK_BUFFER
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING
    assert f"UNUSED CREDIT {(JOBS - 1) * STOCK_BUFFER:,} bytes" in line.getMessage()
    assert "at most 1 evictions alive at once" in line.getMessage()


def test_as_many_evictions_alive_as_race_jobs_audits_clean(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook(hostile())
    held = [measurement._l2_flush_fn(torch.device("cpu"), enabled=True) for _ in range(JOBS)]
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        audit = end_any()
    assert audit.peak_alive == JOBS == len(held) and audit.unused_credit_bytes == 0
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.INFO


def test_no_reference_to_the_weights_after_startup_complete_even_from_a_kept_handle() -> None:
    tensors = weights()
    alive = tensors["model.layers.0.mlp.experts.w13_weight"].untyped_storage()._weak_ref()
    runtime = hostile(tensors=tensors)
    del tensors
    hook(runtime)
    kept = measurement._l2_flush_fn(torch.device("cpu"), enabled=True)  # a job keeps its handle
    end_any()
    runtime.tensors = {}
    gc.collect()
    assert torch.UntypedStorage._expired(alive)
    assert isinstance(kept, EvictionHandle) and kept.eviction.released


# An allocator or runtime that breaks the contract: a coroutine or generator function, an
# awaitable returned, an interrupt with nothing offered.
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


class GeneratorAllocatorStandIn(ReferenceKVAllocator):
    """An add_reclaimed that returns a generator: its body never runs unless iterated."""

    def add_reclaimed(self, report: ReclaimReport) -> Any:
        yield super().add_reclaimed(report)


def test_an_allocator_returning_a_generator_is_recorded_as_raised() -> None:
    allocator = GeneratorAllocatorStandIn(1024)
    host = runtime(allocator=allocator)
    report = hook(host)
    # A generator function is refused before the offer; its report says so.
    assert report.reclaimed_bytes == 0 and "generator function" in (report.reason or "")
    assert allocator.reclaimed_bytes == 0 and not seam_is_ours()


# No host code runs under the plugin's lock (issues 34, 41).
def test_host_code_never_runs_under_the_plugins_lock() -> None:
    seen: list[tuple[str, bool]] = []
    WatchedTensorStandIn.seen = seen
    host = runtime(allocator=WatchedAllocatorStandIn(seen), kind=WatchedUseRuntimeStandIn)
    object.__setattr__(host, "_seen", seen)
    host.tensors = {name: t.as_subclass(WatchedTensorStandIn) for name, t in host.tensors.items()}
    assert hook(host).reclaimed_bytes == CREDIT
    complete(host)
    names = {name for name, _ in seen}
    assert {"device", "race_jobs", "kv_allocator", "add_reclaimed", "__iter__"} <= names, names
    assert [name for name, held in seen if held] == []


def _a_hosts_start_up(seen: Seen) -> None:
    host, second, stranger = watched_host(seen), watched_host(seen), watched_host(seen)
    assert hook(host).reclaimed_bytes == CREDIT
    assert hook(second).reclaimed_bytes == 0  # refused: Busy, naming the active start-up
    assert complete(stranger).refused  # refused, in one line
    flare_l2evict.restore()
    assert complete(host).credited_bytes == CREDIT
    del host, second, stranger
    gc.collect()


def _a_credit_whose_allocator_raised(seen: Seen) -> None:
    host = watched_host(seen, allocator=AppliesThenRaisesHostErrorStandIn(1024))
    assert hook(host).allocator_error is not None
    assert complete(host).credited_bytes == CREDIT


def _a_fork_start_up(seen: Seen) -> None:
    host = watched_host(seen)
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
            seen.append(("fork API", lock_held_here()))

        use_fork_api(monkeypatch, use_startup_eviction)

    return make


def test_no_host_code_runs_while_the_plugin_holds_its_lock(
    fork_api: Callable[[Seen], None],
) -> None:
    seen: Seen = []
    HostErrorStandIn.seen = seen
    with watching(seen):
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


# Any mix of host behaviours.
MODES = ["ok", "raise-before", "apply-then-raise", "re-enter", "keyboard"]


@pytest.mark.slow  # a property test: 60 examples, each real start-ups on threads
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raising=st.one_of(st.none(), st.sampled_from(ATTRIBUTES)),
    modes=st.lists(st.sampled_from(MODES), min_size=1, max_size=2),
    overlapping=st.booleans(),
    on_error=st.sampled_from(["fallback", "raise"]),
    triton=st.booleans(),
)
def test_no_host_behaviour_over_credits_or_leaves_a_credit_unbacked(
    raising: str | None, modes: list[str], overlapping: bool, on_error: str, triton: bool
) -> None:
    # triton: the process imported Triton (the stand-in's), so its flush is installed beside
    # b12x's eviction, and must be stock again whatever the hosts did.
    with contextlib.ExitStack() as stack:
        made = stack.enter_context(triton_imported()) if triton else None
        _no_over_credit_or_unbacked_credit(raising, modes, overlapping, on_error, made)


def _no_over_credit_or_unbacked_credit(
    raising: str | None,
    modes: list[str],
    overlapping: bool,
    on_error: str,
    made: TritonModulesStandIn | None,
) -> None:
    tensors = aliases(8, 96 * MiB) if overlapping else weights()
    runtimes = [hostile(mode, tensors=tensors, raising=raising) for mode in modes]
    allocators = [object.__getattribute__(r, "kv_allocator") for r in runtimes]
    for each in runtimes:
        object.__setattr__(each, "config", {"plugins": {"l2evict": {"on_error": on_error}}})
    escaped: list[BaseException] = []
    start = threading.Barrier(len(runtimes))

    def call(runtime: HostileRuntimeStandIn) -> None:
        start.wait()
        try:
            hook(runtime)
        except BaseException as error:  # collected; judged below
            escaped.append(error)

    threads = [threading.Thread(target=call, args=(r,)) for r in runtimes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    applied = sum(a.applied for a in allocators)
    assert applied in (0, CREDIT)  # at most one credit, across every allocator
    installation = installed()
    if applied:
        assert installation is not None and installation.offered_bytes == CREDIT
        assert seam_is_ours()  # backed until startup_complete
        assert made is None or not made.stock()  # Triton's flush beside it
    for error in escaped:
        expected_base = isinstance(error, KeyboardInterrupt) and "keyboard" in modes
        expected_raise = on_error == "raise" and isinstance(error, L2EvictError)
        assert expected_base or expected_raise, repr(error)
    end_any()
    assert installed() is None and not seam_is_ours()
    assert made is None or made.stock()
