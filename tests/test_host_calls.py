"""What a host's code does when the plugin calls it, or when it calls the plugin, and the
outcome: one credit at a time, always backed until ``startup_complete``.

The host's runtime and allocator are code the plugin does not own, so they are stand-ins here
(named so: ``support/hostile.py``'s, or one per case); pluggy, the plugin, b12x's real seam
and torch are real. What the runtime's values may be is in ``test_host_values.py``; signals,
forks, asynchronous exceptions and a second model in ``test_lifecycle.py``.

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
- any mix of allocator behaviours and raising attributes, on threads (a property test) ->
  at most one credit, always backed until ``startup_complete``.
"""

from __future__ import annotations

import gc
import inspect
import logging
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from support.figures import MiB
from support.hostile import (
    HostileAllocatorStandIn,
    HostileRuntimeStandIn,
    aliases,
    hostile,
)
from support.hosts import CREDIT, JOBS, PM, STOCK_BUFFER, hook, runtime, seam_is_ours, weights
from support.startups import end_any, installed
from support.sums import checksum

from flare_l2evict import L2EvictError, ReclaimReport, StartupAudit
from flare_l2evict._b12x.proof import measure_basis
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict._settings import L2EvictSettings
from flare_l2evict._startup import Startup
from flare_l2evict.hookspecs import RUNTIME_ATTRIBUTES
from flare_l2evict.tools._choose_weights import choose_weights, install

measurement = pytest.importorskip("b12x.preparation._measurement")
ATTRIBUTES = RUNTIME_ATTRIBUTES


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
    began = Startup.begin.__func__.__code__  # type: ignore[attr-defined]

    def pause_once_begun(frame: types.FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not began:
            return None
        if event == "return":
            first_began.set()
            second_done.wait(30)
        return pause_once_begun

    def first() -> None:
        sys.settrace(pause_once_begun)
        try:
            reports.append(hook(runtimes[0]))
        finally:
            sys.settrace(None)

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

    offer = _core._offer.__code__
    ended: list[StartupAudit] = []

    def end_before_the_call(frame: types.FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not offer:
            return None
        source = inspect.getframeinfo(frame).code_context or [""]
        if event == "line" and "raised: BaseException" in source[0] and not ended:
            other = threading.Thread(target=lambda: ended.append(end_any()))
            other.start()
            other.join()
        return end_before_the_call

    runtime = hostile()
    sys.settrace(end_before_the_call)
    try:
        with caplog.at_level(logging.WARNING, logger="flare_l2evict"):
            assert hook(runtime).reclaimed_bytes == CREDIT == runtime.kv_allocator.applied
    finally:
        sys.settrace(None)
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


# Any mix of host behaviours.
MODES = ["ok", "raise-before", "apply-then-raise", "re-enter", "keyboard"]


@pytest.mark.slow  # a property test: 60 examples, each real start-ups on threads
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raising=st.one_of(st.none(), st.sampled_from(ATTRIBUTES)),
    modes=st.lists(st.sampled_from(MODES), min_size=1, max_size=2),
    overlapping=st.booleans(),
    on_error=st.sampled_from(["fallback", "raise"]),
)
def test_no_host_behaviour_over_credits_or_leaves_a_credit_unbacked(
    raising: str | None, modes: list[str], overlapping: bool, on_error: str
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
    for error in escaped:
        expected_base = isinstance(error, KeyboardInterrupt) and "keyboard" in modes
        expected_raise = on_error == "raise" and isinstance(error, L2EvictError)
        assert expected_base or expected_raise, repr(error)
    end_any()
    assert installed() is None and not seam_is_ours()
