"""The sweeps: a signal handler at every line of the runtime, and what holds after each.

Case -> outcome:

- an asynchronous exception, or ``startup_complete`` re-entered, at the first hit of every
  runtime line (and inside every line of the start-up and the seam, after each C call
  returns) from a host's hook to its ``startup_complete``'s last -> either kept and
  credited (and backed), or restored and not credited; ``startup_complete`` always ends what
  was installed: stock b12x, the slot and the lock free, the weights collected; the next
  start-up credits again;
- the same at every point only a start-up in a process that imported Triton reaches (the
  stand-in's module tree: the proof, the install and its check, a ``do_bench``'s flushes, the
  undo, the outcome's line) -> Triton's flush is the plugin's only while b12x's install
  stands, stock's after ``startup_complete`` (the class's methods), and no flush reads the
  weights once the start-up ended;
- an asynchronous exception at every runtime line of an ``evicting_from`` block's entry and
  exit -> the same, the block's weights collected;
- an asynchronous exception at every line of the tools' ``install(...)`` -> the slot free and
  stock bound, at most one ResourceWarning saying the handle ended implicitly;
- ``startup_complete`` at every line of the offer's transition -> the allocator applies a
  credit only while the seam is the plugin's, and the audit says what was credited;
- an exception, or ``restore()`` re-entered, just after any C call of ``startup_complete``'s
  restore returns -> the slot is free only once stock is back, and the next ``restore()``
  puts stock back (issue 46: at 49c0f1a a claim was two C calls, and an exception between
  them lost the step).

Where a sweep stops, and how, is ``support/stops.py``'s. The host's runtime and allocator are
stand-ins (named so); pluggy, the plugin, b12x's real seam and torch are real.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
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
)
from support.startups import end_any, installed
from support.stops import (
    UNTRACED,
    AsynchronousInterrupt,
    Stop,
    Target,
    Tracer,
    first_hits,
    interrupt,
    line_of,
)
from support.triton_stand_in import TritonModulesStandIn, triton_imported

import flare_l2evict
from flare_l2evict import StartupAudit
from flare_l2evict._b12x import seam
from flare_l2evict._startup import Startup
from flare_l2evict.tools.reference_host import ReferenceRuntime

pytest.importorskip("b12x.preparation._measurement")

_RUNTIME = Path(flare_l2evict.__file__).parent
_TRACED = frozenset(
    [str(path) for path in _RUNTIME.rglob("*.py") if _RUNTIME / "tools" not in path.parents]
    + [str(_RUNTIME / "tools" / "_choose_weights.py")]  # the tools' install, a start-up too
)
"""Every file of the runtime (what a server imports; ``tools/`` is not, but for the tools'
install): every line of them, nested functions, lambdas and comprehensions included, is a
point the sweeps stop at."""


_MOVES = frozenset(
    str(_RUNTIME / name) for name in ("_startup.py", "_b12x/seam.py", "_triton/seam.py")
)
"""The files whose lines move the start-up's state (its phase, its slot, its undo steps, b12x's
seam, Triton's driver): the sweeps stop inside each of their lines too, after every C call
returns."""


def _traced(code: types.CodeType) -> bool:
    return code.co_filename in _TRACED


def _moves(code: types.CodeType) -> bool:
    return code.co_filename in _MOVES


def _host(tracer: Tracer) -> None:
    """A host's hook, then its startup_complete, under ``tracer``."""
    host = runtime()
    _run_traced(functools.partial(hook, host), tracer)
    _run_traced(functools.partial(complete, host), tracer)


def _block(tracer: Tracer) -> None:
    """One evicting_from block, entered and left under ``tracer``."""
    tensors = {"w": torch.empty(64 * MiB // 4)}  # uninitialised: no race reads them here
    block = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    _run_traced(block.__enter__, tracer)
    _run_traced(lambda: block.__exit__(None, None, None), tracer)


def _run_traced(call: Callable[[], object], tracer: Tracer) -> bool:
    """Run ``call`` under ``tracer``; whether the armed exception interrupted it."""
    try:
        tracer.run(call)
    except AsynchronousInterrupt:
        return True
    return False


@functools.cache
def _first_hits(run: Callable[[Tracer], None]) -> tuple[Target, ...]:
    """Every runtime line ``run`` reaches, each once, in the order it is first reached (what
    :func:`support.stops.first_hits` leaves out, left out)."""
    run(UNTRACED)  # one-off first lines (imports, caches) run before the count
    return first_hits(run, _traced, inside_lines=_moves)


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


def _hooked_at(target: Target, how: str, where: str) -> tuple[ReferenceRuntime, Any, str, Stop]:
    """A host's hook that meets, at the first hit of ``target``, a signal handler that raises
    (``how = "raise"``) or calls startup_complete with the host's runtime (``"end"``); no credit
    applied while unbacked. The host, its weights' weak reference, ``where`` and the stop."""
    allocator = WitnessAllocatorStandIn(1024)
    # Uninitialised: no race reads them here, and 800 memsets of 64 MiB cost seconds.
    host = runtime(allocator=allocator, tensors={"w": torch.empty(64 * MiB // 4)})
    alive = host.tensors["w"].untyped_storage()._weak_ref()
    # Held weakly: a frame the trace function still marks must not keep the host alive.
    act = interrupt(where) if how == "raise" else functools.partial(_end_of, weakref.ref(host))
    stop = Stop(target, act)
    _run_traced(functools.partial(hook, host), stop)
    assert allocator.backed in (None, True), f"{where}: a credit applied while unbacked"
    return host, alive, where, stop


def _host_at(target: Target, how: str) -> None:
    """A start-up whose hook meets, at the first hit of ``target``, a signal handler that
    raises (``how = "raise"``) or calls startup_complete with the host's runtime
    (``"end"``); then its own startup_complete. The promises hold after each."""
    host, alive, where, stop = _hooked_at(target, how, f"{how} at {target}")
    allocator = host.kv_allocator
    active = installed()
    if active is not None:  # kept: then credited, and backed (or a measured install)
        assert active.offered_bytes == CREDIT and seam_is_ours(), where
    elif Startup.active() is None:  # ended or restored: then stock, whatever it credited
        assert not seam_is_ours(), f"{where}: the seam stayed the plugin's after the end"
    if allocator.reclaimed_bytes and Startup.active() is not None:
        assert seam_is_ours(), f"{where}: a standing credit is not backed"
    _run_traced(functools.partial(complete, host), stop)  # ends what it made
    assert stop.fired, f"{where}: the line was never reached"
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
    seam_lines = {target.line for target in lines if target.file.endswith("_b12x/seam.py")}
    assert line_of(seam._rebind, "setattr(owner, name, replacement)") in seam_lines
    for target in lines[part::_SLICES]:
        _host_at(target, how)


def _bench(made: TritonModulesStandIn) -> None:
    """One ``do_bench`` of the host's, as an autotuner's: its flushes through the driver."""
    made.do_bench(lambda: None, warmup=1, rep=2)


def _triton_host(tracer: Tracer) -> None:
    """:func:`_host`, in a process that imported Triton (the stand-in's): both seams, and a
    ``do_bench`` between the hook and startup_complete."""
    with triton_imported() as made:
        host = runtime()
        _run_traced(functools.partial(hook, host), tracer)
        _run_traced(functools.partial(_bench, made), tracer)
        _run_traced(functools.partial(complete, host), tracer)


def _triton_points() -> tuple[Target, ...]:
    """The points a start-up reaches only with Triton imported: its proof, its install, its
    undo, its line (the rest are :func:`_host`'s, swept above)."""
    plain = set(_first_hits(_host))
    return tuple(target for target in _first_hits(_triton_host) if target not in plain)


def _triton_host_at(target: Target, how: str) -> None:
    """:func:`_host_at` with Triton imported: a signal handler's exception, or its
    startup_complete, at ``target``; then Triton's flush is the plugin's only while b12x's
    install stands, and stock's once the start-up is over, and never reads weights after it."""
    with triton_imported() as made:
        host, alive, where, stop = _hooked_at(target, how, f"{how} at {target} (Triton imported)")
        if installed() is not None:  # kept: b12x's credit backed, and Triton's flush beside it
            assert seam_is_ours() and not made.stock(), where
        elif Startup.active() is None:
            assert made.stock(), f"{where}: Triton's flush stayed the plugin's after the end"
        # A flush the handler cuts, or one after it ended the start-up: never a weights read
        # after the end (the eviction is released; a read then would raise here).
        _run_traced(functools.partial(_bench, made), stop)
        _run_traced(functools.partial(complete, host), stop)
        assert stop.fired, f"{where}: the line was never reached"
        assert made.stock(), f"{where}: Triton's flush stayed the plugin's after the end"
        before = made.driver.made  # type: ignore[attr-defined]
        _bench(made)  # stock's buffer, never the weights
        assert made.driver.made == before + 1, where  # type: ignore[attr-defined]
        del host
        _nothing_stranded(where, alive)
        again = runtime(tensors=_AGAIN)
        assert hook(again).triton.installed, where
        complete(again)
        assert made.stock(), where


@pytest.mark.slow  # a sweep: a start-up per point
@pytest.mark.parametrize("how", ["raise", "end"])
@pytest.mark.parametrize("part", range(_SLICES // 2))
def test_a_signal_at_any_triton_line_of_a_start_up_never_strands_either_seam(
    part: int, how: str
) -> None:
    # Issue 47: every point only a start-up with Triton imported reaches (the proof, the
    # install and its check, the undo, the outcome's line), inside the lines of the seam too.
    points = _triton_points()
    files = {os.path.relpath(target.file, _RUNTIME) for target in points}
    assert {"_triton/proof.py", "_triton/seam.py", "_triton/wing.py", "_triton/flush.py"} <= files
    undo = [t for t in points if t.code.co_name == "put_back"]
    assert any(t.event == "c_return" for t in undo) and any(t.event == "line" for t in undo)
    for target in points[part :: _SLICES // 2]:
        _triton_host_at(target, how)


def _block_at(target: Target) -> None:
    """One block whose entry or exit meets a signal handler's exception at ``target``."""
    tensors = {"w": torch.empty(64 * MiB // 4)}
    alive = tensors["w"].untyped_storage()._weak_ref()
    block = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    where = f"raise at {target} of a block"
    stop = Stop(target, interrupt(where))
    if not _run_traced(block.__enter__, stop):
        _run_traced(functools.partial(block.__exit__, None, None, None), stop)
    assert stop.fired, f"{where}: the line was never reached"
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


def _tools_install(tracer: Tracer) -> None:
    """The tools' install around nothing, entered and left under ``tracer``."""
    from flare_l2evict._b12x.proof import measure_basis
    from flare_l2evict.tools._choose_weights import choose_weights, install

    chosen = choose_weights(_AGAIN, "cpu", MiB)
    basis = measure_basis(torch.device("cpu"), L2, flare_l2evict.L2EvictSettings(), 0)

    def held_for_a_block() -> None:
        with install(chosen, basis) as installed:
            assert installed.mechanism == "stock-seam"

    _run_traced(held_for_a_block, tracer)


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
        where = f"raise at {target} of the tools' install"
        stop = Stop(target, interrupt(where))
        # A handle whose exit was cut short ends when it is dropped, and says so: recorded.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            _tools_install(stop)
            assert stop.fired, f"{where}: the line was never reached"
            for generation in (1, 2):
                if Startup.active() is not None:
                    gc.collect(generation)
        assert not seam_is_ours() and Startup.active() is None, where
        warned = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(warned) <= 1 and all("implicitly ended" in w for w in warned), (where, warned)
        _a_fresh_start_up_credits(where)


# startup_complete at every line of the offer's transition (issue 34).
def _offer_lines() -> tuple[Target, ...]:
    """The lines one offer runs, in order (traced once, on a start-up of its own)."""
    code = Startup.offer.__code__
    host = runtime()

    def run(tracer: Tracer) -> None:
        tracer.run(lambda: hook(host))

    lines = first_hits(run, lambda found: found is code, every_line=True)
    complete(host)
    return lines


def test_startup_complete_inside_the_offer_never_leaves_a_credit_unbacked() -> None:
    lines = _offer_lines()
    assert len(lines) >= 4  # the lock, the two writes, the move
    for target in lines:
        _end_inside_the_offer_at(target)


def _end_inside_the_offer_at(target: Target) -> None:
    fired: list[StartupAudit] = []
    allocator = WitnessAllocatorStandIn(1024)
    host = runtime(allocator=allocator)
    # A signal handler's startup_complete, on this thread.
    stop = Stop(target, lambda: fired.append(end_any()))
    report = stop.run(lambda: hook(host))
    assert fired, target
    (audit,) = fired
    if allocator.reclaimed_bytes:  # applied: then backed while applied, and audited as credited
        assert allocator.backed is True and report.reclaimed_bytes == CREDIT
        assert audit.credited_bytes == CREDIT and audit.mechanism == "stock-seam"
    else:
        assert report.reclaimed_bytes == 0 and "startup_complete ran" in (report.reason or "")
    assert not seam_is_ours() and Startup.active() is None


# Inside a line of the restore: after every C call returns (issue 46).
_RESTORE = (Startup.restore, Startup._restore.__wrapped__, Startup._undo_step, Startup._vacate)  # type: ignore[attr-defined]


def _restore_points() -> tuple[Target, ...]:
    """Every point of startup_complete's restore, its lines and inside them."""
    codes = frozenset(function.__code__ for function in _RESTORE)
    host = runtime()
    hook(host)

    def run(tracer: Tracer) -> None:
        tracer.run(lambda: complete(host))

    points = first_hits(run, codes.__contains__, every_line=True, inside_lines=codes.__contains__)
    return tuple(point for point in points if point.event == "c_return")


@pytest.mark.slow  # a sweep: a start-up per point
@pytest.mark.parametrize("how", ["raise", "restore"])
def test_whatever_cuts_in_after_any_c_call_of_a_restore_loses_no_undo_step(how: str) -> None:
    points = _restore_points()
    assert any(point.callee == "dict.setdefault" for point in points), points  # the claim
    for target in points:
        where = f"{how} at {target}"
        host = runtime()
        hook(host)
        assert seam_is_ours()
        act = interrupt(where) if how == "raise" else flare_l2evict.restore
        stop = Stop(target, act)
        _run_traced(functools.partial(complete, host), stop)
        assert stop.fired, f"{where}: never reached"
        if Startup.active() is None:  # the slot is free only once stock is back
            assert not seam_is_ours(), f"{where}: the slot was freed with the seam the plugin's"
        flare_l2evict.restore()  # what an operator runs after a Ctrl-C
        complete(host)
        assert not seam_is_ours(), f"{where}: the seam stays the plugin's"
        assert Startup.active() is None, f"{where}: {Startup.active()!r}"
