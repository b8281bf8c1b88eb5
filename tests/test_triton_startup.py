"""The Triton wing in the start-up: one start-up, both seams, independent outcomes (issue 47).

Case -> outcome (the reference host on the CPU, through real pluggy; Triton is the vendored
3.6 ``do_bench`` and ``DriverConfig`` around a stand-in driver, set into ``sys.modules`` as a
host that imported Triton would have it, and the CPU served as CUDA is):

- installed -> b12x credited as before (the credit does not change); one INFO line; every
  ``do_bench`` between the hook and ``startup_complete`` reads the weights and zeroes one
  scratch of one L2, the driver's own buffer never made; the audit counts them; after
  ``startup_complete`` or ``restore()`` the driver's methods are its class's own, and a
  ``do_bench`` then is stock's;
- ``triton = false`` (config, or ``evicting_from(triton=False)``), Triton not imported, weights
  off CUDA -> Triton stock, b12x credited, one INFO line (DEBUG when Triton is not imported:
  most hosts never import it);
- a proof refused (another program's method on the driver), a patch that does not take, a
  driver that raises -> Triton stock, named in one WARNING line; b12x credited and installed;
- b12x falls back -> Triton restored with it;
- the host switches the active driver mid-window, a ``do_bench`` on another thread across the
  restore, nested ``evicting_from`` -> the patched instance clean, no flush reads weights after
  the start-up ended, the second block refused and the first standing.

The interrupt sweeps over the same start-up are tests/test_every_line.py's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.hosts import CREDIT, JOBS, L2, complete, hook, runtime, seam_is_ours, weights
from support.startups import installed
from support.triton_stand_in import (
    CudaDriverStandIn,
    TritonModulesStandIn,
    triton_imported,
)

import flare_l2evict
from flare_l2evict._report import TRITON_WITHOUT_B12X
from flare_l2evict._triton.flush import FlushToken
from flare_l2evict._triton.proof import METHODS
from flare_l2evict.tools._origin import stock_row

pytest.importorskip(stock_row().module_path)

STOCK = "Triton's flush stays stock"
INSTALLED = (
    f"flare_l2evict: triton: do_bench's flush reads the weights, then zeroes a scratch of "
    f"{L2:,} bytes per call (stock: 268,435,456)"
)


@pytest.fixture
def triton() -> Iterator[TritonModulesStandIn]:
    with triton_imported() as made:
        yield made


def triton_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "flare_l2evict" and r.getMessage().startswith("flare_l2evict: triton: ")
    ]


def bench(made: TritonModulesStandIn) -> None:
    made.do_bench(lambda: None, warmup=1, rep=2)


# Installed, and stock again after the start-up.


def test_a_start_up_installs_both_seams_credits_b12x_alone_and_ends_both_stock(
    triton: TritonModulesStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    host = runtime()
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(host)
    assert report.reclaimed_bytes == CREDIT == host.kv_allocator.reclaimed_bytes  # unchanged
    assert seam_is_ours() and not triton.stock()
    section = report.triton
    assert (section.installed, section.reason, section.version) == (True, None, "3.6.0")
    assert (section.scratch_bytes, section.stock_bytes) == (L2, 268_435_456)
    assert triton_lines(caplog) == [(logging.INFO, INSTALLED)]
    bench(triton)
    assert triton.driver.made == 0 and triton.driver.cleared == []  # type: ignore[attr-defined]
    audit = complete(host)
    assert audit.triton.installed and audit.triton.calls == 1 and audit.triton.flushes >= 6
    assert (audit.triton.scratch_bytes, audit.triton.stock_calls) == (L2, 0)
    assert audit.credited_bytes == CREDIT
    assert f"; triton: 1 timing calls flushed by the weights ({audit.triton.flushes} flushes)" in (
        audit.summary()
    )
    assert triton.stock() and not seam_is_ours() and installed() is None
    for method in METHODS:  # the class's own again
        assert getattr(triton.driver, method).__func__ is getattr(CudaDriverStandIn, method)
    bench(triton)  # after the start-up: stock's buffer, never the weights
    assert triton.driver.made == 1  # type: ignore[attr-defined]


def test_restore_puts_triton_s_flush_back_with_b12x_s(triton: TritonModulesStandIn) -> None:
    host = runtime()
    assert hook(host).triton.installed and not triton.stock()
    flare_l2evict.restore()
    assert triton.stock() and not seam_is_ours()
    bench(triton)
    assert triton.driver.made == 1  # type: ignore[attr-defined]
    audit = complete(host)
    assert audit.triton.installed and audit.triton.calls == 0 and audit.shortfall_bytes == CREDIT


def test_a_measuring_host_keeps_triton_s_flush_until_its_end(
    triton: TritonModulesStandIn,
) -> None:
    host = runtime()
    object.__setattr__(host, "kv_sizing", "measured")
    report = hook(host)
    assert report.reclaimed_bytes == 0 and report.unallocated_bytes > 0
    assert report.triton.installed and not triton.stock()
    bench(triton)
    assert complete(host).triton.calls == 1 and triton.stock()


def test_a_block_installs_triton_s_flush_and_its_exit_puts_it_back(
    triton: TritonModulesStandIn,
) -> None:
    tensors = weights()
    with flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2) as report:
        assert report.reclaimed_bytes == CREDIT and report.triton.installed
        bench(triton)
        assert triton.driver.made == 0  # type: ignore[attr-defined]
    assert triton.stock()


# Stock, and why: one line each, b12x credited all the same.


@pytest.mark.parametrize("how", ["config", "keyword"])
def test_triton_false_keeps_triton_stock_and_b12x_credited(
    how: str, triton: TritonModulesStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        if how == "config":
            host = runtime(config={"plugins": {"l2evict": {"triton": False}}})
            report = hook(host)
            assert triton.stock()
            complete(host)
        else:
            tensors = weights()
            block = flare_l2evict.evicting_from(
                tensors, race_jobs=JOBS, l2_cache_bytes=L2, triton=False
            )
            with block as report:
                assert triton.stock()
    assert report.reclaimed_bytes == CREDIT and not report.triton.installed
    reason = f"disabled by config (plugins.l2evict.triton = false); {STOCK}"
    assert report.triton.reason == reason
    assert triton_lines(caplog) == [(logging.INFO, f"flare_l2evict: triton: {reason}")]


def test_a_triton_keyword_that_is_no_bool_is_refused_in_one_line() -> None:
    block = flare_l2evict.evicting_from(weights(), race_jobs=JOBS, triton="no")  # type: ignore[arg-type]
    with block as report:
        assert report.reclaimed_bytes == 0
    assert report.reason == (
        'evicting_from: triton = "no" is invalid: use true (the default: while b12x\'s '
        "eviction is installed, Triton's autotuner flushes by reading the same weights) or false "
        "(Triton's flush stays stock); nothing changed; fix: pass triton=True or triton=False"
    )


def test_a_host_that_never_imported_triton_gets_a_debug_line_and_the_reason_in_its_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = runtime()
    with caplog.at_level(logging.DEBUG, logger="flare_l2evict"):
        report = hook(host)
    complete(host)
    assert report.reclaimed_bytes == CREDIT and not report.triton.installed
    reason = "triton is not imported in this process (the plugin never imports it itself); "
    assert report.triton.reason == reason + STOCK
    assert triton_lines(caplog) == [(logging.DEBUG, f"flare_l2evict: triton: {reason}{STOCK}")]


def test_weights_off_cuda_leave_triton_stock_in_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with triton_imported(cpu_served=False) as made:
        host = runtime()
        with caplog.at_level(logging.INFO, logger="flare_l2evict"):
            report = hook(host)
        assert made.stock()
        complete(host)
    reason = f"the weights are on cpu, not a CUDA device; {STOCK}"
    assert report.reclaimed_bytes == CREDIT and report.triton.reason == reason
    assert triton_lines(caplog) == [(logging.INFO, f"flare_l2evict: triton: {reason}")]


def other_program_clear_cache(cache: object) -> None:
    """Another program's flush, set on the driver instance before the plugin came."""


def test_another_program_s_replacement_is_left_alone_named_and_b12x_credited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = CudaDriverStandIn()
    driver.clear_cache = other_program_clear_cache  # type: ignore[method-assign]
    with triton_imported(driver) as made:
        host = runtime()
        with caplog.at_level(logging.INFO, logger="flare_l2evict"):
            report = hook(host)
        assert seam_is_ours() and driver.clear_cache is other_program_clear_cache
        assert "get_empty_cache_for_benchmark" not in vars(driver)
        complete(host)
        assert driver.clear_cache is other_program_clear_cache
        assert made.driver is driver
    assert report.reclaimed_bytes == CREDIT and not report.triton.installed
    ((level, line),) = triton_lines(caplog)
    assert level == logging.WARNING and line == f"flare_l2evict: triton: {report.triton.reason}"
    assert (
        "already carries its own clear_cache (test_triton_startup.other_program_clear_cache, "
        f"another program's): left alone, {STOCK}"
    ) in line


class ShadowlessDriverStandIn(CudaDriverStandIn):
    """A driver whose lookup of the two methods skips its instance: a patch that silently
    does nothing (public code has shipped one)."""

    def __getattribute__(self, name: str) -> Any:
        if name in METHODS:
            return getattr(type(self), name).__get__(self)
        return super().__getattribute__(name)


class RaisingDriverStandIn(CudaDriverStandIn):
    """A driver whose two methods cannot even be read: the install raises before any change."""

    def __getattribute__(self, name: str) -> Any:
        if name in METHODS:
            raise RuntimeError(f"{name} of a broken driver")
        return super().__getattribute__(name)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        (
            ShadowlessDriverStandIn,
            "after setting get_empty_cache_for_benchmark on the active Triton driver, "
            "triton.runtime.driver.active.get_empty_cache_for_benchmark is ",
        ),
        (
            RaisingDriverStandIn,
            "RuntimeError: get_empty_cache_for_benchmark of a broken driver; " + STOCK,
        ),
    ],
)
def test_a_triton_install_that_fails_is_undone_named_and_never_takes_b12x_down(
    kind: type, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = kind()
    with triton_imported(driver, kind) as made:
        host = runtime()
        with caplog.at_level(logging.INFO, logger="flare_l2evict"):
            report = hook(host)
        assert report.reclaimed_bytes == CREDIT == host.kv_allocator.reclaimed_bytes
        assert seam_is_ours() and installed() is not None and made.stock()
        assert not report.triton.installed and said in (report.triton.reason or "")
        audit = complete(host)
        assert made.stock() and not seam_is_ours()
    assert audit.credited_bytes == CREDIT and not audit.triton.installed
    ((level, line),) = triton_lines(caplog)
    assert level == logging.WARNING and said in line and "\n" not in line


def test_a_triton_whose_proof_raises_is_named_and_never_takes_b12x_down(
    triton: TritonModulesStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(name: str) -> object:  # a module-level __getattr__ of a broken install
        raise RuntimeError(f"triton.testing.{name} could not be loaded")

    triton.modules["triton.testing"].__getattr__ = broken  # type: ignore[method-assign]
    host = runtime()
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(host)
    assert report.reclaimed_bytes == CREDIT and seam_is_ours() and triton.stock()
    reason = (
        "proving Triton's seam raised RuntimeError: triton.testing.do_bench_proton could not "
        f"be loaded; {STOCK}"
    )
    assert report.triton.reason == reason
    assert triton_lines(caplog) == [(logging.WARNING, f"flare_l2evict: triton: {reason}")]
    complete(host)


def test_b12x_falling_back_restores_triton_too(
    triton: TritonModulesStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # A tensor only the block holds is not credited: b12x falls back after its install.
    with (
        caplog.at_level(logging.INFO, logger="flare_l2evict"),
        flare_l2evict.evicting_from(weights(), race_jobs=JOBS, l2_cache_bytes=L2) as report,
    ):
        assert report.reclaimed_bytes == 0 and not seam_is_ours() and triton.stock()
        bench(triton)
        assert triton.driver.made == 1  # type: ignore[attr-defined]
    assert not report.triton.installed and report.triton.reason == TRITON_WITHOUT_B12X
    assert triton_lines(caplog) == [(logging.INFO, f"flare_l2evict: triton: {TRITON_WITHOUT_B12X}")]


# A host that moves under the seam.


def test_a_host_that_switches_the_active_driver_mid_window_leaves_both_clean(
    triton: TritonModulesStandIn,
) -> None:
    host = runtime()
    assert hook(host).triton.installed
    other = CudaDriverStandIn()
    triton.config.set_active(other)
    bench(triton)
    assert other.made == 1  # the new driver is stock's
    flare_l2evict.restore()
    assert triton.stock() and not set(METHODS) & set(vars(other))
    assert triton.config.active is other
    audit = complete(host)
    assert audit.triton.calls == 0


def test_a_do_bench_on_another_thread_across_the_restore_gets_stock_s_flush(
    triton: TritonModulesStandIn,
) -> None:
    host = runtime()
    assert hook(host).triton.installed
    inside, go_on = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    runs = [0]

    def timed() -> None:  # its first run is do_bench's warm-up, before its flush buffer
        runs[0] += 1
        if runs[0] == 2:
            inside.set()
            assert go_on.wait(60)

    def other_thread() -> None:
        try:
            triton.do_bench(timed, warmup=1, rep=2)
        except BaseException as error:  # handed to the test's thread
            raised.append(error)

    thread = threading.Thread(target=other_thread)
    thread.start()
    assert inside.wait(60)  # do_bench holds the plugin's token, mid-call
    flare_l2evict.restore()
    assert triton.stock()
    go_on.set()
    thread.join(60)
    assert not thread.is_alive() and raised == []
    cleared = triton.driver.cleared  # type: ignore[attr-defined]
    assert cleared and all(isinstance(cache, FlushToken) for cache in cleared)
    assert all(cache.eviction.released for cache in cleared)  # written alone, never read
    assert triton.driver.made == 0  # type: ignore[attr-defined]
    complete(host)


def test_a_nested_block_is_refused_and_the_first_one_s_triton_flush_stands(
    triton: TritonModulesStandIn,
) -> None:
    outer, inner = weights(), weights()
    with flare_l2evict.evicting_from(outer, race_jobs=JOBS, l2_cache_bytes=L2) as first:
        assert first.triton.installed
        with flare_l2evict.evicting_from(inner, race_jobs=JOBS, l2_cache_bytes=L2) as second:
            assert second.reclaimed_bytes == 0 and not second.triton.installed
        assert not triton.stock() and seam_is_ours()
        bench(triton)
        assert triton.driver.made == 0  # type: ignore[attr-defined]
    assert triton.stock() and not seam_is_ours()


def test_an_autotuned_kernel_that_raises_leaves_the_start_up_whole(
    triton: TritonModulesStandIn,
) -> None:
    host = runtime()
    assert hook(host).triton.installed

    runs = [0]

    def kernel() -> None:  # an autotuner's config that fails once timing began
        runs[0] += 1
        if runs[0] > 1:
            raise ValueError("the kernel failed")

    with pytest.raises(ValueError, match="the kernel failed"):
        triton.do_bench(kernel, warmup=1, rep=2)
    bench(triton)
    audit = complete(host)
    assert audit.triton.calls == 2 and audit.credited_bytes == CREDIT
    assert triton.stock() and triton.driver.made == 0  # type: ignore[attr-defined]
