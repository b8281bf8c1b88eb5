"""The host behaviours catalogue: what a KV allocator or runtime object may do, and the outcome.

The host's runtime and allocator are code the plugin does not own, so they are
stand-ins here (named as such); pluggy, the plugin, b12x's seam and torch are real.

Behaviour -> outcome:

- allocator applies the credit, then raises -> the credit stays backed: eviction kept
  until startup_complete; report and audit say it raised;
- allocator raises before applying -> the same (the plugin cannot tell the two apart);
- allocator re-enters before_first_capture -> the inner call credits 0 and touches
  nothing; one credit in all;
- two threads call the hook at once -> one credit in all; the other call credits 0;
- storages that overlap in memory -> counted once; a window they cannot cover: 0;
- an attribute (or add_reclaimed) is a raising property -> 0 with one line naming it;
- resident_tensors() returns a bare tensor -> 0 with one line; never iterated;
- hook under torch.inference_mode(), races outside -> races run (torch read here,
  Triton on GPU in test_gpu_host.py);
- on_error = "raise" with a contract violation -> one line raised, stock b12x restored;
- KeyboardInterrupt/SystemExit from add_reclaimed -> propagates; eviction kept; the
  audit records it;
- BaseException before the offer -> propagates; nothing installed;
- L2 of 50 MiB + 1 byte, no window set -> credited: stock's window in whole words;
- fewer evictions alive at once than race_jobs -> audit WARNING naming the bytes.

A process group whose size differs from ``world_size`` is in ``test_tp_gloo.py``
(real gloo processes).
"""

from __future__ import annotations

import gc
import itertools
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from support.figures import OWN, MiB
from support.hosts import CREDIT, JOBS, L2, PM, STOCK_BUFFER, hook, seam_is_ours, weights
from support.startups import end_any, installed
from support.sums import checksum, read_bytes

import flare_l2evict
from flare_l2evict import L2EvictError, ReclaimReport
from flare_l2evict._b12x.proof import measure_basis
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict._settings import L2EvictSettings
from flare_l2evict._startup import Startup
from flare_l2evict._weights import MAX_TENSORS
from flare_l2evict.hookspecs import RUNTIME_ATTRIBUTES
from flare_l2evict.tools._choose_weights import choose_weights, install

measurement = pytest.importorskip("b12x.preparation._measurement")
ATTRIBUTES = RUNTIME_ATTRIBUTES


@dataclass
class HostileRuntimeStandIn:
    """A host runtime that can misbehave: raising properties.

    ``raising`` names the attribute whose read raises; ``tensors`` is whatever
    ``resident_tensors()`` returns.
    """

    kv_allocator: Any
    tensors: Any
    config: Any = field(default_factory=dict)
    raising: str | None = None
    rank_: Any = 0
    world_size_: Any = 1
    race_jobs_: Any = JOBS

    def _read(self, name: str, value: Any) -> Any:
        if self.raising == name:
            raise RuntimeError(f"host property {name} exploded")
        return value

    device = property(lambda self: self._read("device", torch.device("cpu")))
    rank = property(lambda self: self._read("rank", self.rank_))
    world_size = property(lambda self: self._read("world_size", self.world_size_))
    process_group = property(lambda self: self._read("process_group", None))
    race_jobs = property(lambda self: self._read("race_jobs", self.race_jobs_))
    l2_cache_bytes = property(lambda self: self._read("l2_cache_bytes", L2))
    kv_sizing = property(lambda self: self._read("kv_sizing", None))

    def __getattribute__(self, name: str) -> Any:
        if name in ("kv_allocator", "config") and object.__getattribute__(self, "raising") == name:
            raise RuntimeError(f"host property {name} exploded")
        if name == "resident_tensors" and object.__getattribute__(self, "raising") == name:
            raise RuntimeError("host property resident_tensors exploded")
        return object.__getattribute__(self, name)

    def resident_tensors(self) -> Any:
        return self.tensors


class HostileAllocatorStandIn:
    """A host KV allocator with a chosen misbehaviour.

    ``mode``: ``ok``; ``raise-before`` (refuses, applies nothing);
    ``apply-then-raise``; ``re-enter`` (calls the hook again from inside);
    ``keyboard`` (applies, then KeyboardInterrupt); ``exit`` (SystemExit).
    ``applied`` is what it really added to its budget.
    """

    def __init__(self, mode: str = "ok", pm: Any = None, runtime: Any = None) -> None:
        self.mode, self.pm, self.runtime = mode, pm, runtime
        self.applied = 0
        self.inner: list[ReclaimReport] = []

    def add_reclaimed(self, report: ReclaimReport) -> None:
        if self.mode == "raise-before":
            raise RuntimeError("allocator refused")
        self.applied += report.reclaimed_bytes
        if self.mode == "apply-then-raise":
            raise RuntimeError("allocator applied, then failed")
        if self.mode == "re-enter":
            self.inner.extend(self.pm.hook.before_first_capture(runtime=self.runtime))
        if self.mode == "keyboard":
            raise KeyboardInterrupt
        if self.mode == "exit":
            raise SystemExit(3)


_WEIGHTS = object()


def hostile(mode: str = "ok", tensors: Any = _WEIGHTS, **kwargs: Any) -> HostileRuntimeStandIn:
    """The shared host (support.hosts: its PM, weights(), L2 and JOBS) with a hostile shape."""
    allocator = HostileAllocatorStandIn(mode, PM)
    runtime = HostileRuntimeStandIn(
        allocator, weights() if tensors is _WEIGHTS else tensors, **kwargs
    )
    allocator.runtime = runtime
    return runtime


# 1. An allocator that applies the credit, then raises: the credit stays backed.
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


# 2. An allocator that re-enters the hook.
def test_an_allocator_that_re_enters_the_hook_gets_one_credit() -> None:
    runtime = hostile("re-enter")
    report = hook(runtime)
    assert report.reclaimed_bytes == CREDIT
    (inner,) = runtime.kv_allocator.inner
    assert inner.reclaimed_bytes == 0 and "re-entrant call" in inner.reason
    assert runtime.kv_allocator.applied == CREDIT  # the inner call touched no allocator


# 3. Two threads at once: the second calls while the first's start-up is under way.
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


# 4. Storages that overlap in memory count once.
def aliases(count: int, nbytes: int) -> dict[str, torch.Tensor]:
    """``count`` distinct storage objects over one allocation (storage slices), and its owner.

    The slices borrow the owner's memory and are never read themselves
    (tests/test_weights.py); the owner's tensor covers the same bytes.
    """
    base = torch.zeros(nbytes // 4).untyped_storage()
    slices = {
        f"alias.{i}": torch.empty(0).set_(base[0:nbytes], 0, (nbytes // 4,), (1,))
        for i in range(count)
    }
    return {"owner": torch.empty(0).set_(base), **slices}


def test_storages_that_overlap_in_memory_count_once() -> None:
    tensors = aliases(130, MiB)
    assert len({id(t.untyped_storage()) for t in tensors.values()}) == 131
    report = hook(hostile(tensors=tensors))
    assert report.reclaimed_bytes == 0
    assert "1 eligible storage holds 1,048,576 distinct bytes" in (report.reason or "")


def test_partly_overlapping_storages_are_read_once_each_byte() -> None:
    base = torch.zeros(96 * MiB // 4).untyped_storage()
    tensors = {
        "owner": torch.empty(0).set_(base),
        "a": torch.empty(0).set_(base[0 : 64 * MiB], 0, (16 * MiB,), (1,)),
        "b": torch.empty(0).set_(base[32 * MiB : 96 * MiB], 0, (16 * MiB,), (1,)),
    }
    choice = choose_weights(tensors, "cpu", 96 * MiB)
    (region,) = choice.regions
    assert region.nbytes == 96 * MiB and read_bytes(choice) == 96 * MiB
    with pytest.raises(flare_l2evict.WeightsError, match=r"96.*distinct bytes"):
        choose_weights(tensors, "cpu", 128 * MiB)  # 2 x 64 MiB, but 96 distinct


# 5. Any attribute may be a property that raises.
@pytest.mark.parametrize("name", [*ATTRIBUTES, "add_reclaimed"])
def test_a_raising_property_gives_zero_and_one_line(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = hostile()
    if name == "add_reclaimed":
        runtime.kv_allocator = RaisingAddReclaimedStandIn()
    else:
        runtime.raising = name
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(runtime)
    assert report.reclaimed_bytes == 0
    shown = "kv_allocator" if name == "add_reclaimed" else name
    assert report.reason is not None
    assert f"runtime.{shown}" in report.reason and "exploded" in report.reason
    assert installed() is None and not seam_is_ours()
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and "\n" not in line.getMessage()


class RaisingAddReclaimedStandIn:
    """An allocator whose add_reclaimed is a property that raises."""

    @property
    def add_reclaimed(self) -> Callable[[object], None]:
        raise RuntimeError("host property add_reclaimed exploded")


# 6. resident_tensors() returns a bare tensor.
class NeverIteratedTensorStandIn(torch.Tensor):
    """A tensor that fails the test if anything iterates its elements."""

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("the plugin iterated a tensor's elements")


def test_a_bare_tensor_from_resident_tensors_is_named_without_iterating_it() -> None:
    bare = torch.zeros(4_000_000).as_subclass(NeverIteratedTensorStandIn)
    report = hook(hostile(tensors=bare))
    assert report.reclaimed_bytes == 0
    assert report.reason is not None
    assert "resident_tensors() returned a Tensor of shape (4000000,)" in report.reason
    assert "not a mapping of names to tensors" in report.reason


@pytest.mark.parametrize(
    ("returned", "named"), [([1, 2], "a list of 2 items"), (None, "a NoneType")]
)
def test_other_non_mappings_are_named(returned: object, named: str) -> None:
    report = hook(hostile(tensors=returned))
    assert report.reclaimed_bytes == 0 and f"returned {named}" in (report.reason or "")


# 7. The hook under torch.inference_mode(), the races outside it (torch read path on CPU).
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


# 8. on_error = "raise" raises for every contract violation, after restoring stock b12x.
@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"race_jobs_": -1}, "runtime.race_jobs = -1"),
        ({"world_size_": 2}, "runtime.process_group = None"),
        ({"config": {"plugins": {"l2evict": {"on_error": "raise", "x": 1}}}}, "unknown key"),
        ({"raising": "device"}, "runtime.device raised RuntimeError"),
    ],
    ids=["race_jobs", "no-group", "unknown-key", "raising-device"],
)
def test_on_error_raise_raises_for_contract_violations(change: dict[str, Any], line: str) -> None:
    runtime = hostile()
    runtime.config = {"plugins": {"l2evict": {"on_error": "raise"}}}
    for name, value in change.items():
        setattr(runtime, name, value)
    with pytest.raises(L2EvictError, match="on_error = 'raise'") as raised:
        hook(runtime)
    assert line in str(raised.value) and "\n" not in str(raised.value)
    assert runtime.kv_allocator.applied == 0
    assert installed() is None and not seam_is_ours()


# 10. KeyboardInterrupt / SystemExit from add_reclaimed.
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


# 11. An L2 that is not a whole number of words, with no window set.
def test_an_odd_l2_with_the_stock_window_is_credited() -> None:
    runtime = hostile(tensors=weights(256 * MiB))
    odd = 50 * MiB + 1
    runtime.__class__ = type(
        "OddL2RuntimeStandIn", (HostileRuntimeStandIn,), {"l2_cache_bytes": odd}
    )
    report = hook(runtime)
    stock = -(-max(2 * odd, 64 * MiB) // 4) * 4
    assert report.window_bytes == stock
    assert report.reclaimed_bytes == JOBS * stock - OWN


# 8 (issue item 8). The audit holds race_jobs to the evictions alive at once.
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


# 9 (issue item 9). A property over host behaviours.
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
    for runtime in runtimes:
        object.__setattr__(runtime, "config", {"plugins": {"l2evict": {"on_error": on_error}}})
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


def test_hostile_runtime_stand_in_is_a_runtime() -> None:
    """The stand-in reads like a host's object, so the cases above test the real contract."""
    runtime = hostile()
    seen: Mapping[str, Any] = {name: getattr(runtime, name) for name in ATTRIBUTES}
    assert seen["device"] == torch.device("cpu") and callable(seen["resident_tensors"])
    report = hook(runtime)
    assert report.reclaimed_bytes == CREDIT == runtime.kv_allocator.applied


# Found by a hostile review of the above (each a reproduced fault, now closed).
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


def test_an_installation_made_before_the_hook_is_never_credited() -> None:
    tiny = choose_weights({"tiny": torch.zeros(MiB // 4)}, "cpu", MiB)
    settings = L2EvictSettings.model_construct(window=MiB)
    with install(tiny, measure_basis(tiny.device, MiB, settings, 0)) as earlier:
        runtime = hostile()
        report = hook(runtime)
        assert report.reclaimed_bytes == 0 and "while a start-up is active" in (report.reason or "")
        assert runtime.kv_allocator.applied == 0
        assert installed() is earlier.startup  # left as it was


class OverstatedStorageStandIn(torch.UntypedStorage):
    """A storage whose Python-level size claims a gigabyte over one mebibyte."""

    def __len__(self) -> int:
        return 1 << 30

    def nbytes(self) -> int:
        return 1 << 30


def test_a_storage_cannot_overstate_its_size_or_be_grown() -> None:
    tensor = torch.empty(0).set_(OverstatedStorageStandIn(MiB))  # type: ignore[no-untyped-call]
    address = tensor.data_ptr()
    report = hook(hostile(tensors={"w": tensor}))
    assert report.reclaimed_bytes == 0 and "1,048,576 distinct bytes" in (report.reason or "")
    assert tensor.data_ptr() == address
    assert torch.UntypedStorage.nbytes(tensor.untyped_storage()) == MiB  # never written


class UnprintableStandIn:
    """A host value whose repr raises."""

    def __repr__(self) -> str:
        raise RuntimeError("repr")


class RaisingClassStandIn:
    """A host value whose __class__ raises, so even isinstance() on it raises."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("__class__")


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise ValueError("no text")


@pytest.mark.parametrize(
    "change",
    [
        {"device": UnprintableStandIn()},
        {"rank_": RaisingClassStandIn()},
        {"race_jobs_": RaisingClassStandIn()},
        {"tensors": UnprintableStandIn()},
    ],
    ids=["device-repr", "rank-class", "race-jobs-class", "tensors-repr"],
)
def test_host_values_that_cannot_be_printed_or_inspected_give_zero(change: dict[str, Any]) -> None:
    runtime = hostile()
    for name, value in change.items():
        if name == "device":  # a property: shadow it on a subclass
            runtime.__class__ = type(
                "DeviceRuntimeStandIn", (HostileRuntimeStandIn,), {name: value}
            )
        else:
            setattr(runtime, name, value)
    report = hook(runtime)
    assert report.reclaimed_bytes == 0 and report.reason and "\n" not in report.reason


def test_an_exception_whose_message_raises_gives_zero() -> None:
    class RaisingTensorsStandIn(HostileRuntimeStandIn):
        def resident_tensors(self) -> Any:
            raise UnprintableError

    report = hook(RaisingTensorsStandIn(HostileAllocatorStandIn(), weights()))
    assert report.reclaimed_bytes == 0
    assert "UnprintableError: <its message could not be read>" in (report.reason or "")


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


class ForgingNameStandIn(str):
    """A tensor name whose repr forges a second log line."""

    def __repr__(self) -> str:
        return "w'\nINFO flare_l2evict: reclaimed 0 bytes (forged)"


@pytest.mark.parametrize(
    "name", [ForgingNameStandIn("w"), "w" * 5_000_000], ids=["forged-repr", "5-MB-name"]
)
def test_echoed_names_stay_on_one_bounded_line(name: str, caplog: pytest.LogCaptureFixture) -> None:
    runtime = hostile(tensors={name: torch.zeros(128 * MiB // 4)})
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        first = hook(runtime)
        again = hook(runtime)  # the refusal names the active installation
    assert first.reclaimed_bytes == CREDIT and again.reclaimed_bytes == 0
    for record in caplog.records:
        text = record.getMessage()
        assert "\n" not in text and len(text) < 2_000, text[:300]
    assert again.reason is not None and "\n" not in again.reason


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


def test_a_wrapper_subclass_without_storage_bytes_is_skipped_not_fatal() -> None:
    class WrapperTensorStandIn(torch.Tensor):
        """A DTensor-like wrapper: a tensor with no readable storage of its own."""

        @staticmethod
        def __new__(cls, size: int) -> Any:
            return torch.Tensor._make_wrapper_subclass(cls, (size,), dtype=torch.float32)

        @classmethod
        def __torch_dispatch__(  # type: ignore[override]  # a classmethod, as torch's own are
            cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            raise NotImplementedError

    tensors = {"wrapped": WrapperTensorStandIn(1 << 28), **weights()}
    report = hook(hostile(tensors=tensors))
    assert report.reclaimed_bytes == CREDIT
    assert report.source_tensor == "model.layers.0.mlp.experts.w13_weight"


def test_a_mapping_with_endless_names_is_refused_in_bounded_memory() -> None:
    class EndlessMappingStandIn(Mapping[str, torch.Tensor]):
        def __getitem__(self, key: str) -> torch.Tensor:
            return torch.zeros(1)

        def __iter__(self) -> Iterator[str]:
            return (f"t{i}" for i in itertools.count())

        def __len__(self) -> int:
            return 1 << 62

    report = hook(hostile(tensors=EndlessMappingStandIn()))
    assert report.reclaimed_bytes == 0 and f"more than {MAX_TENSORS:,} names" in (
        report.reason or ""
    )


def test_an_on_error_value_equal_to_anything_does_not_turn_fallback_into_raise() -> None:
    class EqualToAnythingStandIn:
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    config = {"plugins": {"l2evict": {"on_error": EqualToAnythingStandIn()}}}
    report = hook(hostile(config=config))
    assert report.reclaimed_bytes == 0 and "on_error" in (report.reason or "")
