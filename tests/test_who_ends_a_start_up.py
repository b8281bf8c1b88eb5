"""Who ends a start-up, and when: its own ``startup_complete`` (with its runtime or a report
it handed out), whatever a signal handler, a second model or another thread calls meanwhile.

Case -> outcome:

- ``startup_complete(runtime=B)`` of a second model while model A starts up -> a no-op with
  one line; A's start-up, credit and eviction stand until A's own call;
- a second model's ``before_first_capture`` while A's start-up is active -> 0, one line
  naming a second model's call;
- a signal handler that calls ``startup_complete`` on the thread that holds the lock
  (delivered inside the hook's locked section) -> no deadlock (a real signal, in a child
  process with a deadline);
- a signal handler that calls ``startup_complete`` during ``add_reclaimed`` -> the credit
  stays backed until the allocator returns, then stock is back; one that raises there -> the
  credit stays backed until ``startup_complete``;
- a signal handler inside A's close that ends A and starts B -> B keeps its slot;
- ``startup_complete`` re-entered mid-change of the seam -> stock bound, 0 credited;
- an exception at the provider's version lookup, or at the entry of a block's exit -> the
  block's start-up ends, its weights are collected; an interrupt in the hook's exit -> the
  start-up is settled as the hook leaves;
- a start-up that fell back -> holds no host object, ended by anyone's ``startup_complete``
  once its runtime is gone; a credited one outlives its runtime object and ends by its
  report;
- a host that builds its runtime per call, whose ``add_reclaimed`` applies the credit and
  raises -> the report the allocator received ends the start-up; the next one credits;
- one ``evicting_from`` object entered twice -> the second entry is refused in one line and
  the first stands until its own exit; a tools install dropped without ``end()`` -> the slot
  is freed, said in one line;
- two ``startup_complete`` at once -> one credits, no false shortfall; one inside the offer
  -> the hook does not log "reclaimed" for a start-up already gone.

The host's runtime and allocator are stand-ins (named so); pluggy, the plugin, b12x's real
seam, signals and torch are real.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.figures import MiB
from support.hosts import CREDIT, JOBS, L2, complete, hook, runtime, seam_is_ours, weights
from support.startups import installed
from support.stops import AsynchronousInterrupt, Stop, at, interrupt

import flare_l2evict
from flare_l2evict import ReclaimReport, StartupAudit, _core, _program
from flare_l2evict._b12x import seam
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict._startup import Phase, Startup
from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime

measurement = pytest.importorskip("b12x.preparation._measurement")
DEADLINE = 120.0  # seconds a child may take before the test calls it a hang
TESTS = Path(__file__).resolve().parent


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


# 2. Signal handlers that call startup_complete.
_SIGNAL_INSIDE_THE_LOCK = """
import json, os, signal, sys, torch
sys.path.insert(0, sys.argv[1])  # the tests' support package
from support.stops import Stop, at
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
# Inside the locked section: a real signal, handled on this thread right here.
inside = at(Startup.begin, 'if cls._active is None and not setattr(cls, "_active", made)')
stop = Stop(inside, lambda: os.kill(os.getpid(), signal.SIGUSR1))
(report,) = stop.run(lambda: pm.hook.before_first_capture(runtime=runtime))
pm.hook.startup_complete(runtime=runtime)
sent = int(stop.fired)
print(json.dumps({"sent": sent, "handled": len(audits), "reclaimed": report.reclaimed_bytes}))
"""


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_a_signal_handler_calling_startup_complete_inside_the_lock_does_not_deadlock() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SIGNAL_INSIDE_THE_LOCK, str(TESTS)],
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


# 4. A start-up outlives its runtime object; a credit offered is ended only by the start-up
# that offered it (issue 28).
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


# 6. Two ends at once, an install dropped without end(), an end inside the offer.
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


# 7. An end or an exception at the lines the re-attacks found (issues 28, 38, 41).
def test_a_start_up_begun_inside_the_last_ones_close_keeps_its_slot() -> None:
    # A signal handler inside model A's close ends A and starts model B; A's close then
    # cleared the slot B held: B stood patched and credited with nothing able to end it.
    first, second = runtime(), runtime()
    assert hook(first).reclaimed_bytes == CREDIT
    began: list[ReclaimReport] = []

    def signal_handler() -> None:
        complete(first)
        began.append(hook(second))

    stop = Stop(at(Startup._vacate, "over and Startup._active is self"), signal_handler)
    stop.run(lambda: complete(first))
    assert stop.fired and began[0].reclaimed_bytes == CREDIT
    active = Startup.active()
    assert active is not None and active.owned_by(second) and seam_is_ours()
    assert complete(second).credited_bytes == CREDIT
    assert not seam_is_ours() and Startup.active() is None


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

    stop = Stop(at(seam._rebind, text), signal_handler)
    report = stop.run(lambda: hook(host))
    assert stop.fired
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

    def at_the_lookup() -> None:
        raise ProviderInterrupt("at the version lookup")

    stop = Stop(at(provider.installed_version, "return None"), at_the_lookup)
    with stop.tracing(), pytest.raises(ProviderInterrupt), block:
        pass
    assert stop.fired
    del block
    gc.collect()
    assert not seam_is_ours() and Startup.active() is None
    assert torch.UntypedStorage._expired(alive), "the block's weights are still held"


def test_an_exception_at_the_entry_of_a_blocks_exit_still_ends_its_start_up() -> None:
    # A signal handler's exception can land as __exit__ is entered, before any of its
    # lines; the with statement then drops the block, and its start-up still ends.
    class Interrupt(KeyboardInterrupt):
        pass

    def at_the_entry() -> None:
        raise Interrupt

    stop = Stop(at(_program._Block.__exit__, event="call"), at_the_entry)
    weights = torch.zeros(64 * MiB // 4)
    with pytest.warns(ResourceWarning, match="an evicting_from block dropped before its exit"):
        with pytest.raises(Interrupt), stop.tracing():
            with flare_l2evict.evicting_from(
                {"w": weights}, race_jobs=JOBS, l2_cache_bytes=L2
            ) as r:
                assert r.reclaimed_bytes > 0 and seam_is_ours()
        gc.collect()  # the block, whose exit never ran, ends its start-up: said, not silent
    assert stop.fired and not seam_is_ours()
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

    stop = Stop(at(_core.start, text), interrupt(f"at {text}"))
    with pytest.raises(AsynchronousInterrupt):
        stop.run(lambda: hook(host))
    assert stop.fired
    assert not seam_is_ours() and installed() is None  # settled as the hook left: restored
    again = hook(host)  # held until startup_complete, as after any hook: said truly
    assert again.reclaimed_bytes == 0 and "repeated call" in (again.reason or ""), again.reason
    complete(host)
    assert Startup.active() is None
    retry = runtime()
    assert hook(retry).reclaimed_bytes == CREDIT
    complete(retry)
