"""The start-up object against what a hostile host or program does at its seams (issue 34).

Case -> outcome:

- host code (attributes, the mapping, tensor methods, the allocator) -> never runs under the
  plugin's lock, so a host lock taken there cannot deadlock against startup_complete;
- startup_complete at any line of the offer's transition -> the allocator applies a credit
  only while the seam is the plugin's, and the audit says what was credited;
- a host that builds its runtime per call, whose add_reclaimed applies the credit and raises
  -> the report the allocator received ends the start-up; the next one credits;
- a fork while another thread is inside add_reclaimed -> the child's startup_complete restores;
- one evicting_from object entered twice -> the second entry is refused in one line and the
  first stands until its own exit;
- an exception inside an undo -> neither the audit nor an undo step is lost;
- host and program values -> one set of bounds.

Stand-ins are named so; pluggy, the plugin, b12x's real seam, fork and torch are real.
"""

from __future__ import annotations

import linecache
import logging
import os
import signal
import sys
import threading
import time
import types
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch
from support.fake_b12x import use_fork_api
from support.figures import MiB
from support.hosts import (
    CREDIT,
    JOBS,
    L2,
    WitnessAllocatorStandIn,
    complete,
    hook,
    runtime,
    seam_is_ours,
    weights,
)
from support.startups import end_any, installed

import flare_l2evict
from flare_l2evict import ReclaimReport, StartupAudit, _request
from flare_l2evict._startup import Phase, Startup
from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime

pytest.importorskip("b12x.preparation._measurement")
DEADLINE = 120.0


def _lock_held_here() -> bool:
    return bool(Startup._lock._is_owned())  # type: ignore[attr-defined]


# 1. Host code never runs under the plugin's lock.
class WatchedMappingStandIn(dict[str, torch.Tensor]):
    """The host's resident tensors, noting whether each method ran under the plugin's lock."""

    seen: list[tuple[str, bool]]

    def _note(self, name: str) -> None:
        self.seen.append((name, _lock_held_here()))

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

    seen: ClassVar[list[tuple[str, bool]]] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.seen.append((getattr(func, "__name__", str(func)), _lock_held_here()))
        return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]


class WatchedRuntimeStandIn(ReferenceRuntime):
    """A host whose every attribute read and call notes whether the plugin's lock is held."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "_seen").append((name, _lock_held_here()))
        return object.__getattribute__(self, name)

    def resident_tensors(self) -> Any:
        mapping = WatchedMappingStandIn(object.__getattribute__(self, "tensors"))
        mapping.seen = object.__getattribute__(self, "_seen")
        return mapping


class WatchedAllocatorStandIn(ReferenceKVAllocator):
    def __init__(self, seen: list[tuple[str, bool]]) -> None:
        super().__init__(1024)
        self.seen = seen

    def add_reclaimed(self, report: ReclaimReport) -> None:
        self.seen.append(("add_reclaimed", _lock_held_here()))
        super().add_reclaimed(report)


def test_host_code_never_runs_under_the_plugins_lock() -> None:
    seen: list[tuple[str, bool]] = []
    WatchedTensorStandIn.seen = seen
    host = runtime(allocator=WatchedAllocatorStandIn(seen), kind=WatchedRuntimeStandIn)
    object.__setattr__(host, "_seen", seen)
    host.tensors = {name: t.as_subclass(WatchedTensorStandIn) for name, t in host.tensors.items()}
    assert hook(host).reclaimed_bytes == CREDIT
    complete(host)
    names = {name for name, _ in seen}
    assert {"device", "race_jobs", "kv_allocator", "add_reclaimed", "__iter__"} <= names, names
    assert [name for name, held in seen if held] == []


# 2. startup_complete at every line of the offer's transition.
def _offer_lines() -> list[int]:
    """The lines one offer runs, in order (traced once, on a start-up of its own)."""
    code, lines = Startup.offer.__code__, []

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            lines.append(frame.f_lineno)
        return local

    host = runtime()
    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        hook(host)
    finally:
        sys.settrace(None)
    complete(host)
    return list(dict.fromkeys(lines))


def test_startup_complete_inside_the_offer_never_leaves_a_credit_unbacked() -> None:
    lines = _offer_lines()
    assert len(lines) >= 4  # the lock, the two writes, the move
    for line in lines:
        _end_inside_the_offer_at(line)


def _end_inside_the_offer_at(line: int) -> None:
    code, fired = Startup.offer.__code__, list[StartupAudit]()

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(end_any())  # a signal handler's startup_complete, on this thread
        return local

    allocator = WitnessAllocatorStandIn(1024)
    host = runtime(allocator=allocator)
    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        report = hook(host)
    finally:
        sys.settrace(None)
    assert fired, line
    (audit,) = fired
    if allocator.reclaimed_bytes:  # applied: then backed while applied, and audited as credited
        assert allocator.backed is True and report.reclaimed_bytes == CREDIT
        assert audit.credited_bytes == CREDIT and audit.mechanism == "stock-seam"
    else:
        assert report.reclaimed_bytes == 0 and "startup_complete ran" in (report.reason or "")
    assert not seam_is_ours() and Startup.active() is None


# 3. A host that builds its runtime object per call.
class AppliesThenRaisesStandIn(ReferenceKVAllocator):
    """Applies the credit, then raises ``error``; keeps the report it received."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(1024)
        self.error = error
        self.received: ReclaimReport | None = None

    def add_reclaimed(self, report: ReclaimReport) -> None:
        self.received = report
        super().add_reclaimed(report)
        raise self.error


@pytest.mark.parametrize(
    ("error", "config"),
    [
        (KeyboardInterrupt("host"), {}),
        (RuntimeError("host"), {"plugins": {"l2evict": {"on_error": "raise"}}}),
    ],
    ids=["interrupt-under-fallback", "error-under-raise"],
)
def test_the_report_the_allocator_received_ends_the_start_up(
    error: BaseException, config: dict[str, Any]
) -> None:
    allocator = AppliesThenRaisesStandIn(error)
    with pytest.raises(BaseException):  # noqa: B017  # the hook raises: the host gets no report
        hook(runtime(allocator=allocator, config=config))  # a runtime object made for this call
    assert allocator.reclaimed_bytes == CREDIT and seam_is_ours()  # applied, and backed
    audit = complete(allocator.received)  # all the host has of this start-up
    assert audit.credited_bytes == CREDIT and audit.allocator_error is not None
    assert not seam_is_ours() and Startup.active() is None
    again = runtime()
    assert hook(again).reclaimed_bytes == CREDIT  # nothing stuck
    complete(again)


# 4. A fork while another thread is inside add_reclaimed (or anywhere in its hook).
def _child_says(pid: int, read: int, write: int) -> str:
    """What the forked child wrote, once it exited; the test fails if it hangs."""
    os.close(write)
    deadline = time.monotonic() + DEADLINE
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the forked child hung for {DEADLINE:.0f} s")
        time.sleep(0.05)
    got = os.read(read, 64).decode()
    os.close(read)
    return got


class BlockingAllocatorStandIn(ReferenceKVAllocator):
    def __init__(self) -> None:
        super().__init__(1024)
        self.inside, self.release = threading.Event(), threading.Event()

    def add_reclaimed(self, report: ReclaimReport) -> None:
        super().add_reclaimed(report)
        self.inside.set()
        self.release.wait(DEADLINE)


def test_a_child_forked_during_add_reclaimed_restores_at_its_startup_complete() -> None:
    allocator = BlockingAllocatorStandIn()
    host = runtime(allocator=allocator)
    worker = threading.Thread(target=hook, args=(host,))
    worker.start()
    assert allocator.inside.wait(30)
    read, write = os.pipe()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: on purpose
            pid = os.fork()
        if pid == 0:  # the child: end its copy of the start-up, report the seam, leave
            try:
                torch.set_num_threads(1)  # the parent's thread pool is not in the child
                audit = complete(host)
                os.write(write, f"{audit.credited_bytes} {seam_is_ours()}".encode())
            finally:
                os._exit(0)
    finally:
        allocator.release.set()
        worker.join()
    got = _child_says(pid, read, write)
    assert got == f"{CREDIT} False"  # the child ended its copy: stock b12x there
    assert seam_is_ours()  # the parent's start-up stands until its own startup_complete
    complete(host)


# 5. One evicting_from object entered twice.
def _held_open(block: Any) -> Iterator[None]:
    with block:  # a second entry, held open by a generator on the same thread
        yield


@pytest.mark.parametrize("how", ["nested", "from-a-generator", "after-its-exit"])
def test_a_block_entered_twice_refuses_the_second_entry_and_keeps_the_first(how: str) -> None:
    tensors = weights()  # the program keeps its weights
    block = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    with block as outer:
        assert outer.reclaimed_bytes == CREDIT and seam_is_ours()
        if how == "nested":
            with pytest.raises(flare_l2evict.L2EvictError, match="already entered") as raised:
                with block:
                    pass
            assert "\n" not in str(raised.value) and "fix: make a new evicting_from" in str(
                raised.value
            )
        elif how == "from-a-generator":
            held = _held_open(block)
            with pytest.raises(flare_l2evict.L2EvictError, match="already entered"):
                next(held)
        assert seam_is_ours()  # the second entry ended nothing of the first block
        active = installed()
        assert active is not None and active.phase is Phase.CREDITED
    assert not seam_is_ours() and Startup.active() is None  # its own exit ended it
    if how == "after-its-exit":
        with pytest.raises(flare_l2evict.L2EvictError, match="already entered"):
            with block:
                pass
    again = runtime()
    assert hook(again).reclaimed_bytes == CREDIT  # nothing stuck
    complete(again)


# 6. Exceptions inside an undo.
def test_an_interrupt_inside_the_forks_undo_keeps_the_audit_and_restores(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    handed: list[object] = []

    def fork_stand_in(storage: object) -> None:
        if storage is None and handed.count(None) == 0:
            handed.append(None)
            raise KeyboardInterrupt("a signal during the fork's undo")
        handed.append(storage)

    use_fork_api(monkeypatch, fork_stand_in)
    host = runtime()
    assert hook(host).mechanism == "fork"
    with caplog.at_level(logging.INFO, logger="flare_l2evict"), pytest.raises(KeyboardInterrupt):
        complete(host)
    assert handed[-1] is None  # the undo ran through on its second try
    audits = [r.getMessage() for r in caplog.records if "audit:" in r.getMessage()]
    assert len(audits) == 1 and "via the fork's API" in audits[0]
    assert Startup.active() is None


def test_an_exception_just_before_an_undo_step_does_not_skip_it() -> None:
    undone = Startup._undone.__code__
    fired: list[int] = []

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        if (
            event == "line"
            and not fired
            and "step()" in linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        ):
            fired.append(frame.f_lineno)
            raise RuntimeError("a signal handler's, just before the step")
        return local

    host = runtime()
    assert hook(host).reclaimed_bytes == CREDIT and seam_is_ours()
    sys.settrace(lambda frame, event, arg: local if frame.f_code is undone else None)
    try:
        audit = complete(host)
    finally:
        sys.settrace(None)
    assert fired and audit.credited_bytes == CREDIT
    assert not seam_is_ours() and Startup.active() is None


# 7. Host and program values meet one set of bounds.
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("race_jobs", -1),
        ("race_jobs", 0),
        ("race_jobs", _request.MAX_RACE_JOBS),
        ("race_jobs", _request.MAX_RACE_JOBS + 1),
        ("race_jobs", True),
        ("race_jobs", 2.0),
        ("l2_cache_bytes", 0),
        ("l2_cache_bytes", 1),
        ("l2_cache_bytes", _request.MAX_L2_BYTES),
        ("l2_cache_bytes", _request.MAX_L2_BYTES + 1),
        ("l2_cache_bytes", None),
        ("device", "cuda:0"),
        ("device", "tpu"),
    ],
)
def test_host_and_program_values_meet_one_set_of_bounds(name: str, value: object) -> None:
    given: dict[str, Any] = {"race_jobs": JOBS, "l2_cache_bytes": L2, "device": "cpu"}
    given[name] = value
    host = runtime(race_jobs=given["race_jobs"])
    host.l2_cache_bytes, host.device = given["l2_cache_bytes"], given["device"]
    host_refused = (hook(host).reason or "").startswith(f"runtime.{name} ")
    end_any()
    with flare_l2evict.evicting_from(weights(), **given) as report:
        program_refused = (report.reason or "").startswith(f"evicting_from: {name} =")
    assert host_refused == program_refused, (name, value)


# 8. What a hostile review of the start-up object found (each a reproduced fault, now closed).
class NamelessMeta(type):
    """An exception type whose very name raises."""

    def __getattribute__(cls, name: str) -> Any:
        if name == "__name__":
            raise RuntimeError("no name")
        return super().__getattribute__(name)


class NamelessError(Exception, metaclass=NamelessMeta):
    pass


class NamelessRaisingRuntimeStandIn(ReferenceRuntime):
    @property
    def race_jobs(self) -> int:
        raise NamelessError("host")

    @race_jobs.setter
    def race_jobs(self, value: int) -> None:
        pass


def test_an_exception_whose_type_has_no_readable_name_falls_back_in_one_line() -> None:
    report = hook(runtime(kind=NamelessRaisingRuntimeStandIn))
    assert report.reclaimed_bytes == 0 and "runtime.race_jobs raised" in (report.reason or "")
    assert Startup.active() is not None and not seam_is_ours()


def test_a_restore_during_a_measured_start_up_is_audited_as_a_fallback() -> None:
    host = runtime()
    object.__setattr__(host, "kv_sizing", "measured")
    assert hook(host).unallocated_bytes > 0 and seam_is_ours()
    assert complete(None).refused  # a stranger's startup_complete(None) ends nothing
    assert seam_is_ours()
    flare_l2evict.restore()
    audit = complete(host)
    assert audit.mechanism == "stock-seam" and audit.warns
    assert "restore() ran before startup_complete" in (audit.fallback_reason or "")


def test_two_startup_completes_at_once_audit_no_false_shortfall() -> None:
    host = runtime()
    report = hook(host)
    audits: list[StartupAudit] = []
    threads = [
        threading.Thread(target=lambda ender=ender: audits.append(complete(ender)))
        for ender in (host, report)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.credited_bytes for a in audits) == [0, CREDIT]
    assert all(a.shortfall_bytes == 0 and a.fallback_reason is None for a in audits), audits
    assert not seam_is_ours() and Startup.active() is None


def test_a_tools_installation_dropped_without_end_frees_the_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from flare_l2evict._b12x.proof import measure_basis
    from flare_l2evict.tools._choose_weights import choose_weights, install

    tensors = weights()
    settings = flare_l2evict.L2EvictSettings.model_construct(window=MiB)
    chosen = choose_weights(tensors, "cpu", MiB)
    installed_by_tool = install(chosen, measure_basis(chosen.device, MiB, settings, 0))
    assert seam_is_ours()
    with (
        caplog.at_level(logging.WARNING, logger="flare_l2evict"),
        pytest.warns(ResourceWarning, match="an install\\(...\\) handle dropped without end"),
    ):
        del installed_by_tool, chosen
    assert not seam_is_ours() and Startup.active() is None
    assert caplog.text.count("dropped without end()") == 1
    again = runtime()
    assert hook(again).reclaimed_bytes == CREDIT
    complete(again)


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


class BlockingMappingStandIn(dict[str, torch.Tensor]):
    """Resident tensors whose iteration waits: its start-up is BEGUN meanwhile."""

    inside = threading.Event()
    release = threading.Event()

    def __iter__(self) -> Iterator[str]:
        BlockingMappingStandIn.inside.set()
        BlockingMappingStandIn.release.wait(DEADLINE)
        return super().__iter__()


class BlockingRuntimeStandIn(ReferenceRuntime):
    def resident_tensors(self) -> Any:
        return BlockingMappingStandIn(super().resident_tensors())


def test_a_child_forked_while_another_thread_is_mid_hook_starts_up_afresh() -> None:
    BlockingMappingStandIn.inside.clear()
    BlockingMappingStandIn.release.clear()
    host = runtime(kind=BlockingRuntimeStandIn)
    worker = threading.Thread(target=hook, args=(host,))
    worker.start()
    assert BlockingMappingStandIn.inside.wait(30)
    read, write = os.pipe()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: on purpose
            pid = os.fork()
        if pid == 0:  # the child: its own start-up, then the seam
            try:
                torch.set_num_threads(1)  # the parent's thread pool is not in the child
                child = runtime()
                credited = hook(child).reclaimed_bytes
                complete(child)
                os.write(write, f"{credited} {seam_is_ours()}".encode())
            finally:
                os._exit(0)
    finally:
        BlockingMappingStandIn.release.set()
        worker.join()
    got = _child_says(pid, read, write)
    assert got == f"{CREDIT} False"  # the parent's half-run hook did not hold the child's slot
    complete(host)


class EndsDuringTheOfferStandIn(ReferenceKVAllocator):
    """Applies the credit, then ends the start-up (startup_complete) before returning."""

    host: Any = None

    def add_reclaimed(self, report: ReclaimReport) -> None:
        super().add_reclaimed(report)
        complete(self.host)


def test_a_start_up_ended_during_the_offer_is_not_logged_as_reclaimed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 41: the audit warned, then the hook logged INFO "reclaimed ... bytes" for a
    # start-up already gone.
    allocator = EndsDuringTheOfferStandIn(1024)
    host = runtime(allocator=allocator)
    allocator.host = host
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(host)
    assert report.reclaimed_bytes == CREDIT == allocator.reclaimed_bytes  # what it was offered
    assert not seam_is_ours() and Startup.active() is None  # ended, as startup_complete asked
    lines = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING], caplog.text
    audit, ended = (r.getMessage() for r in lines)
    assert "audit: credited" in audit
    assert "ended during the offer" in ended and "startup_complete ran inside" in ended, ended
    assert "fix: " in ended and "\n" not in ended


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
