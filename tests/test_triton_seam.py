"""The Triton wing: the proof before the patch, the two methods, and the undo (issue 47).

Case -> outcome:

- Triton 3.6's ``do_bench`` (vendored) -> proven: it asks ``runtime.driver.active`` for both
  methods each time it runs; a timing path that flushes another way -> refused, named;
- a driver of another class (HIP's), with neither method, with one, or already carrying
  another program's method on the instance -> refused, left alone, named;
- installed -> ``do_bench`` reads the window, then zeroes one scratch per call; the driver's
  own buffer is never made; a buffer the plugin did not make, another device, a released
  eviction -> the driver's own methods, counted;
- the undo -> the class's methods show through again, run once or twice, even after the
  host switched the active driver; another program's later replacement is left alone;
- a flush captured into a CUDA graph -> the read and the write, and its token pins the
  storages read, so a replay after the start-up reads live memory;
- an interrupt between registering an undo and its change, or at any line or C call's
  return of the install or the undo -> running the list (again) puts stock back.

Stand-ins are named so; the wing, the eviction and Triton 3.6's ``do_bench`` (vendored,
or the real one where Triton is installed) are real.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
import torch
from support.sums import checksum
from support.triton_stand_in import (
    CudaDriverStandIn,
    HIPDriverStandIn,
    excerpt,
    vendored_config,
    vendored_testing,
    weights_eviction,
)
from torch.multiprocessing.reductions import StorageWeakRef

import flare_l2evict
from flare_l2evict._errors import InstallError
from flare_l2evict._triton import flush as _flush, seam as _seam
from flare_l2evict._triton.flush import FlushToken, scratch_bytes
from flare_l2evict._triton.proof import (
    METHODS,
    TritonProof,
    Verdict,
    driver_lookups,
    function_code,
    prove,
    prove_triton,
    timing_functions,
)
from flare_l2evict._triton.seam import TritonSeam

L2 = 1 << 12  # the stand-in's "L2": the scratch is one of it


def proven(driver: object | None = None, cuda: type = CudaDriverStandIn) -> tuple[Any, Verdict]:
    """A driver config holding ``driver`` (a fresh stand-in) and the verdict on it."""
    config = vendored_config(CudaDriverStandIn if driver is None else lambda: driver)
    testing = vendored_testing(config)
    return config, prove(config, {"do_bench": testing.do_bench}, cuda, "3.6.0")


def installed(undo: list[Callable[[], None]]) -> tuple[Any, TritonSeam, torch.Tensor, Any]:
    """A stand-in driver patched by the wing over fresh CPU weights: (config, seam, weights,
    eviction); the undo steps land in ``undo``."""
    config, verdict = proven()
    assert verdict.proof is not None, verdict.reason
    weights, eviction = weights_eviction(window_bytes=L2)
    seam = TritonSeam(verdict.proof, scratch_bytes(L2))
    seam.install(eviction, undo)
    return config, seam, weights, eviction


def stock(driver: object) -> bool:
    """Whether the driver's two methods are its class's own again (no instance attribute)."""
    return not set(METHODS) & set(vars(driver))


# The proof, from code objects.


def test_triton_3_6_do_bench_asks_the_active_driver_for_both_methods_when_it_runs() -> None:
    code = function_code(excerpt("testing.py"), "do_bench")
    assert code is not None
    found = driver_lookups(code)
    assert {("runtime", "get_empty_cache_for_benchmark"), ("runtime", "clear_cache")} <= found


def test_a_do_bench_that_flushes_its_own_buffer_is_refused_by_name() -> None:
    text = excerpt("testing.py").replace(
        "runtime.driver.active.clear_cache(cache)", "cache.zero_()"
    )
    space: dict[str, Any] = {"runtime": None}
    exec(compile(text, "testing.py", "exec", dont_inherit=True), space)
    config = vendored_config(CudaDriverStandIn)
    space["runtime"] = type("RuntimeStandIn", (), {"driver": config})
    verdict = prove(config, {"do_bench": space["do_bench"]}, CudaDriverStandIn, "9.9")
    assert verdict.proof is None
    assert verdict.reason.startswith(
        "triton.testing.do_bench does not ask runtime.driver.active for clear_cache"
    )
    assert stock(config.active)


def test_a_proton_path_is_proven_where_it_exists_and_refused_when_it_flushes_elsewhere() -> None:
    config = vendored_config(CudaDriverStandIn)
    runtime = type("RuntimeStandIn", (), {"driver": config})
    space: dict[str, Any] = {"runtime": runtime, "torch": torch}
    exec(
        "def do_bench_proton(fn):\n"
        "    cache = runtime.driver.active.get_empty_cache_for_benchmark()\n"
        "    runtime.driver.active.clear_cache(cache)\n"
        "def do_bench_cudagraph_proton(fn):\n"
        "    cache = torch.empty(1)\n"
        "    cache.zero_()\n",
        space,
    )
    do_bench = vendored_testing(config).do_bench
    proton, graph_proton = space["do_bench_proton"], space["do_bench_cudagraph_proton"]
    both = prove(
        config, {"do_bench": do_bench, "do_bench_proton": proton}, CudaDriverStandIn, "3.9"
    )
    assert both.proof is not None and both.proof.timing == ("do_bench", "do_bench_proton")
    timing = {"do_bench": do_bench, "do_bench_cudagraph_proton": graph_proton}
    graph = prove(config, timing, CudaDriverStandIn, "3.9.0")
    assert graph.proof is None and "do_bench_cudagraph_proton does not ask" in graph.reason


def test_a_do_bench_reading_another_runtime_than_the_one_patched_is_refused() -> None:
    config = vendored_config(CudaDriverStandIn)
    testing = vendored_testing(vendored_config(CudaDriverStandIn))  # another DriverConfig
    verdict = prove(config, {"do_bench": testing.do_bench}, CudaDriverStandIn, "3.6.0")
    assert verdict.proof is None and "from an object other than triton.runtime.driver" in (
        verdict.reason
    )


class NeitherMethodStandIn:
    """A CUDA driver class of a Triton whose flush has moved off the driver."""


class OneMethodStandIn:
    def get_empty_cache_for_benchmark(self) -> torch.Tensor:
        return torch.empty(1)


@pytest.mark.parametrize(
    ("kind", "missing"),
    [(NeitherMethodStandIn, "get_empty_cache_for_benchmark"), (OneMethodStandIn, "clear_cache")],
)
def test_a_driver_without_a_method_is_refused_naming_it(kind: type, missing: str) -> None:
    driver = kind()
    _, verdict = proven(driver, cuda=kind)
    assert verdict.proof is None
    assert f"has no {missing}: this Triton flushes another way" in verdict.reason
    assert vars(driver) == {}


def test_amd_s_driver_is_refused_as_not_cuda_s() -> None:
    driver = HIPDriverStandIn()
    _, verdict = proven(driver)
    assert verdict.proof is None and "(AMD's HIP driver), not triton.backends.nvidia" in (
        verdict.reason
    )
    assert stock(driver)


def other_program_clear_cache(cache: object) -> None:
    """Another program's flush, set on the driver instance before the plugin came."""


def test_another_program_s_replacement_on_the_instance_is_left_alone_and_named() -> None:
    driver = CudaDriverStandIn()
    driver.clear_cache = other_program_clear_cache  # type: ignore[method-assign]
    _, verdict = proven(driver)
    assert verdict.proof is None
    assert (
        "already carries its own clear_cache (test_triton_seam.other_program_clear_cache, "
        "another program's): left alone" in verdict.reason
    )
    assert driver.clear_cache is other_program_clear_cache


def test_a_seam_an_earlier_start_up_left_is_named_as_this_plugin_s() -> None:
    undo: list[Callable[[], None]] = []
    config, _, _weights, _ = installed(undo)  # never undone
    verdict = prove(
        config, {"do_bench": vendored_testing(config).do_bench}, CudaDriverStandIn, "3.6"
    )
    assert verdict.proof is None
    assert "get_empty_cache_for_benchmark (flare_l2evict._triton.flush.flush_methods.<locals>." in (
        verdict.reason
    )
    assert "left by an earlier start-up of this plugin): left alone" in verdict.reason


def test_no_active_driver_is_a_verdict_not_a_traceback() -> None:
    def no_gpu() -> object:
        raise RuntimeError("0 active drivers ([]). There should only be one.")

    config = vendored_config(no_gpu)
    verdict = prove(
        config, {"do_bench": vendored_testing(config).do_bench}, CudaDriverStandIn, "3.6"
    )
    assert verdict.proof is None
    assert verdict.reason == (
        "Triton has no active driver (RuntimeError: 0 active drivers ([]). There should only "
        "be one.); Triton's flush stays stock"
    )


def test_the_triton_installed_here_gets_a_one_line_verdict() -> None:
    verdict = prove_triton()
    assert "\n" not in verdict.reason
    try:
        import triton  # noqa: F401
    except ImportError:
        assert verdict == Verdict(None, "triton is not installed: no do_bench to patch")
        return
    if not torch.cuda.is_available():
        assert verdict.proof is None and verdict.reason.startswith("Triton has no active driver")


# The two methods, installed.


def test_do_bench_reads_the_window_then_zeroes_one_scratch_and_never_makes_stock_s() -> None:
    undo: list[Callable[[], None]] = []
    config, seam, _weights, eviction = installed(undo)
    driver = config.active
    eviction._partial.zero_()
    vendored_testing(config).do_bench(lambda: None, warmup=1, rep=2)
    counts = seam.counts
    assert (counts.calls, counts.scratch_bytes, counts.stock_calls) == (1, L2, 0)
    assert counts.flushes >= 6 and counts.scratch_only == counts.stock_flushes == 0  # 5 + timed
    assert checksum(eviction) == L2 // 4  # the window read: ones
    assert driver.made == 0 and driver.cleared == []
    for step in reversed(undo):
        step()
    assert stock(driver)


def test_a_buffer_the_plugin_did_not_make_gets_the_driver_s_own_clear() -> None:
    undo: list[Callable[[], None]] = []
    config, seam, _weights, _ = installed(undo)
    driver = config.active
    foreign = torch.ones(8, dtype=torch.int)
    driver.clear_cache(foreign)
    assert driver.cleared == [foreign] and int(foreign.sum()) == 0
    assert (seam.counts.stock_flushes, seam.counts.flushes) == (1, 0)


def test_a_released_eviction_or_another_device_leaves_do_bench_stock() -> None:
    undo: list[Callable[[], None]] = []
    config, seam, _weights, eviction = installed(undo)
    driver = config.active
    eviction.release()
    vendored_testing(config).do_bench(lambda: None, warmup=1, rep=2)
    assert driver.made == 1 and all(isinstance(c, torch.Tensor) for c in driver.cleared)
    assert (seam.counts.stock_calls, seam.counts.stock_bytes) == (1, CudaDriverStandIn.BUFFER_BYTES)
    assert seam.counts.calls == 0


def test_a_flush_on_another_device_is_the_driver_s_own() -> None:
    from flare_l2evict._triton.flush import Counts, flush_methods

    driver, (_weights, eviction) = CudaDriverStandIn(), weights_eviction(window_bytes=L2)
    counts = Counts()

    def current_device_stand_in(kind: str) -> torch.device:
        return torch.device("cuda", 1)  # the host's do_bench runs on another GPU

    methods = flush_methods(
        eviction,
        {m: getattr(driver, m) for m in METHODS},
        L2,
        counts,
        current_device_stand_in,
    )
    made = methods["get_empty_cache_for_benchmark"]()
    assert isinstance(made, torch.Tensor) and driver.made == 1 and counts.stock_calls == 1


class RaisingDriverStandIn(CudaDriverStandIn):
    """A driver whose own flush methods raise: what stock would give, the plugin gives."""

    def get_empty_cache_for_benchmark(self) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB")

    def clear_cache(self, cache: Any) -> None:
        raise RuntimeError("clear_cache of the driver")


def test_methods_that_raise_are_never_called_when_served_and_raise_as_stock_when_not() -> None:
    driver = RaisingDriverStandIn()
    config, verdict = proven(driver, cuda=RaisingDriverStandIn)
    assert verdict.proof is not None
    _weights, eviction = weights_eviction(window_bytes=L2)
    undo: list[Callable[[], None]] = []
    TritonSeam(verdict.proof, scratch_bytes(L2)).install(eviction, undo)
    vendored_testing(config).do_bench(lambda: None, warmup=1, rep=2)  # served: never called
    with pytest.raises(RuntimeError, match="clear_cache of the driver"):
        driver.clear_cache(torch.ones(1))
    eviction.release()
    with pytest.raises(torch.OutOfMemoryError):
        vendored_testing(config).do_bench(lambda: None, warmup=1, rep=2)
    for step in undo:
        step()
    assert stock(driver)


def test_a_timed_function_that_raises_leaves_the_seam_installed_and_its_counts_whole() -> None:
    undo: list[Callable[[], None]] = []
    config, seam, _weights, _ = installed(undo)

    def fails() -> None:
        if seam.counts.flushes:
            raise ValueError("the kernel failed")

    with pytest.raises(ValueError, match="the kernel failed"):
        vendored_testing(config).do_bench(fails, warmup=1, rep=2)
    assert (seam.counts.calls, seam.counts.flushes) == (1, 1)
    vendored_testing(config).do_bench(lambda: None, warmup=1, rep=2)
    assert seam.counts.calls == 2


def test_a_token_across_the_undo_is_zeroed_by_stock_s_clear_and_reads_no_weights() -> None:
    undo: list[Callable[[], None]] = []
    config, _, _weights, eviction = installed(undo)
    driver = config.active
    token = driver.get_empty_cache_for_benchmark()
    assert isinstance(token, FlushToken)
    token.scratch.fill_(7)
    for step in undo:
        step()
    eviction._partial.zero_()
    driver.clear_cache(token)  # the class's own: cache.zero_()
    assert driver.cleared == [token] and int(token.scratch.sum()) == 0
    assert checksum(eviction) == 0


def capturing_stand_in(device: torch.device) -> bool:
    """The calling CUDA stream capturing a graph (CPU tensors cannot be captured)."""
    return True


def test_a_captured_flush_reads_and_writes_and_pins_what_it_read_while_its_token_lives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    undo: list[Callable[[], None]] = []
    config, seam, weights, eviction = installed(undo)
    driver = config.active
    token = driver.get_empty_cache_for_benchmark()
    driver.clear_cache(token)
    assert token.pinned == ()  # not captured: nothing held beyond the call's scratch
    monkeypatch.setattr(_flush, "_capturing", capturing_stand_in)
    eviction._partial.zero_()
    driver.clear_cache(token)
    assert (seam.counts.flushes, seam.counts.captured) == (2, 1)
    assert checksum(eviction) == L2 // 4  # stock's two steps, captured too
    memory = StorageWeakRef(weights.untyped_storage())  # type: ignore[no-untyped-call]
    for step in undo:
        step()
    eviction.release()
    del weights  # the host frees its weights after the start-up
    assert not memory.expired()  # type: ignore[no-untyped-call]  # a replay reads live memory
    del token
    assert memory.expired()  # type: ignore[no-untyped-call]


# The undo.


def test_the_undo_deletes_what_it_added_once_or_twice() -> None:
    undo: list[Callable[[], None]] = []
    config, _, _, _ = installed(undo)
    driver = config.active
    assert len(undo) == 2 and not stock(driver)
    for _ in range(2):
        for step in reversed(undo):
            step()
        assert stock(driver)
        assert driver.clear_cache.__func__ is CudaDriverStandIn.clear_cache


def test_the_undo_re_sets_an_instance_attribute_that_was_there_before() -> None:
    driver, undo = CudaDriverStandIn(), list[Callable[[], None]]()
    driver.clear_cache = other_program_clear_cache  # type: ignore[method-assign]

    def plugin_s(cache: object) -> None:
        pass

    _seam._set_on_instance(driver, "clear_cache", plugin_s, undo)
    assert driver.clear_cache is plugin_s
    undo[0]()
    undo[0]()
    assert vars(driver)["clear_cache"] is other_program_clear_cache


def test_the_undo_leaves_a_later_program_s_replacement_alone() -> None:
    undo: list[Callable[[], None]] = []
    config, _, _, _ = installed(undo)
    driver = config.active
    driver.clear_cache = other_program_clear_cache
    for step in undo:
        step()
    assert driver.clear_cache is other_program_clear_cache
    assert "get_empty_cache_for_benchmark" not in vars(driver)


@pytest.mark.parametrize("switch", ["set_active", "reset_active"])
def test_a_host_that_switches_the_active_driver_mid_window_gets_stock_and_a_whole_undo(
    switch: str,
) -> None:
    undo: list[Callable[[], None]] = []
    config, seam, _, _ = installed(undo)
    patched = config.active
    if switch == "set_active":
        config.set_active(CudaDriverStandIn())
    else:
        config.set_active(patched)  # a host's own driver was active; reset to the default
        config._default = CudaDriverStandIn()
        config.reset_active()
    other = config.active
    assert other is not patched
    vendored_testing(config).do_bench(lambda: None, warmup=1, rep=2)
    assert other.made == 1 and seam.counts.calls == 0  # the new driver is stock's
    for step in undo:
        step()
    assert stock(patched) and stock(other) and config.active is other


def test_a_driver_switched_between_proof_and_install_is_refused_and_undone() -> None:
    config, verdict = proven()
    assert verdict.proof is not None
    patched = config.active
    config.set_active(CudaDriverStandIn())  # the patch would not reach do_bench
    _, eviction = weights_eviction(window_bytes=L2)
    undo: list[Callable[[], None]] = []
    with pytest.raises(
        InstallError, match=r"is .*CudaDriverStandIn\.get_empty_cache_for_benchmark"
    ):
        TritonSeam(verdict.proof, scratch_bytes(L2)).install(eviction, undo)
    assert stock(patched) and len(undo) == 2


class InterruptingUndoStandIn(list[Callable[[], None]]):
    """The start-up's undo list, interrupted right after its ``nth`` registration."""

    def __init__(self, nth: int) -> None:
        super().__init__()
        self.nth = nth

    def append(self, step: Callable[[], None]) -> None:
        super().append(step)
        if len(self) == self.nth:
            raise KeyboardInterrupt


@pytest.mark.parametrize("nth", [1, 2])
def test_an_interrupt_between_registering_an_undo_and_its_change_is_harmless(nth: int) -> None:
    config, verdict = proven()
    assert isinstance(verdict.proof, TritonProof)
    _, eviction = weights_eviction(window_bytes=L2)
    undo = InterruptingUndoStandIn(nth)
    with pytest.raises(KeyboardInterrupt):
        TritonSeam(verdict.proof, scratch_bytes(L2)).install(eviction, undo)
    assert len(undo) == nth and len(set(METHODS) & set(vars(config.active))) == nth - 1
    for step in undo:
        step()
    assert stock(config.active)


def test_the_scratch_is_whole_words_of_a_positive_size() -> None:
    assert scratch_bytes(50 << 20) == 52_428_800
    assert scratch_bytes(50 << 20, 0.25) == 13_107_200
    assert scratch_bytes(10, 0.1) == 4
    with pytest.raises(ValueError, match="both must be positive"):
        scratch_bytes(0)


# Real Triton, where it is installed (not on CI): its do_bench through a stand-in driver.


def test_real_triton_do_bench_flushes_through_the_plugin_on_a_stand_in_driver() -> None:
    triton = pytest.importorskip("triton")
    testing = timing_functions(importlib.import_module("triton.testing"))

    config = triton.runtime.driver
    before = config._active
    driver = CudaDriverStandIn()
    config.set_active(driver)
    undo: list[Callable[[], None]] = []
    try:
        verdict = prove(config, testing, CudaDriverStandIn, triton.__version__)
        assert verdict.proof is not None, verdict.reason
        _weights, eviction = weights_eviction(window_bytes=L2)
        seam = TritonSeam(verdict.proof, scratch_bytes(L2))
        seam.install(eviction, undo)
        testing["do_bench"](lambda: None, warmup=1, rep=2)
        assert seam.counts.calls == 1 and seam.counts.flushes >= 6 and driver.made == 0
    finally:
        for step in undo:
            step()
        config.set_active(before)
    assert stock(driver)


def test_only_the_triton_wing_names_triton_s_driver() -> None:
    # Issue 47: the start-up takes the wing's steps without knowing the library they came from.
    runtime = Path(flare_l2evict.__file__).parent
    wing, names = runtime / "_triton", (*METHODS, "runtime.driver", "driver.active", "do_bench")
    named = [
        f"{path.relative_to(runtime)} names {name}"
        for path in sorted(runtime.rglob("*.py"))
        if wing not in path.parents and "tools" not in path.relative_to(runtime).parts
        for name in names
        if name in path.read_text(encoding="utf-8")
    ]
    assert named == []


# Interrupts at every line and every C call's return of the install and the undo.


class InterruptStandIn(KeyboardInterrupt):
    """What a signal handler raises inside a line: Ctrl-C, as the host sees it."""


def _nested(code: CodeType) -> set[CodeType]:
    inner = {c for c in code.co_consts if isinstance(c, CodeType)}
    return {code}.union(*(_nested(c) for c in inner))


_INSTALL = frozenset(
    {*_nested(_seam._set_on_instance.__code__), TritonSeam.install.__code__}
    - {c for c in _nested(_seam._set_on_instance.__code__) if c.co_name == "put_back"}
)
_UNDO = frozenset(c for c in _nested(_seam._set_on_instance.__code__) if c.co_name == "put_back")


@contextlib.contextmanager
def interrupted_at(n: int, kind: str, codes: frozenset[CodeType]) -> Iterator[list[int]]:
    """Raise :class:`InterruptStandIn` at the ``n``-th ``kind`` event (``line`` or ``c_return``)
    in ``codes``' frames (``n`` 0: never); yields the count of such events seen."""
    seen = [0]

    def hit(frame: FrameType, event: str) -> None:
        if event == kind and frame.f_code in codes:
            seen[0] += 1
            if seen[0] == n:
                raise InterruptStandIn

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        hit(frame, event)
        return local

    def call(frame: FrameType, event: str, _arg: Any) -> Any:
        return local if frame.f_code in codes else None

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        hit(frame, event)

    if kind == "line":
        sys.settrace(call)
    else:
        sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.settrace(None)
        sys.setprofile(None)


@pytest.mark.parametrize("kind", ["line", "c_return"])
def test_an_interrupt_anywhere_in_the_install_leaves_an_undo_list_that_puts_stock_back(
    kind: str,
) -> None:
    undo: list[Callable[[], None]] = []
    with interrupted_at(0, kind, _INSTALL) as seen:
        installed(undo)
    points = seen[0]
    assert points >= 4, points
    for n in range(1, points + 1):
        config, verdict = proven()
        assert verdict.proof is not None
        _weights, eviction = weights_eviction(window_bytes=L2)
        undo = []
        with contextlib.suppress(InterruptStandIn), interrupted_at(n, kind, _INSTALL):
            TritonSeam(verdict.proof, scratch_bytes(L2)).install(eviction, undo)
        for step in reversed(undo):
            step()
        assert stock(config.active), f"{kind} {n} of {points}: the seam stays the plugin's"


@pytest.mark.parametrize("kind", ["line", "c_return"])
def test_an_interrupt_anywhere_in_the_undo_is_made_good_by_running_it_again(kind: str) -> None:
    undo: list[Callable[[], None]] = []
    installed(undo)
    with interrupted_at(0, kind, _UNDO) as seen:
        for step in reversed(undo):
            step()
    points = seen[0]
    assert points >= 2, points
    for n in range(1, points + 1):
        undo = []
        config, _, _, _ = installed(undo)
        with contextlib.suppress(InterruptStandIn), interrupted_at(n, kind, _UNDO):
            for step in reversed(undo):
                step()
        for step in reversed(undo):
            step()
        assert stock(config.active), f"{kind} {n} of {points}: the seam stays the plugin's"
