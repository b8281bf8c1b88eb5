"""Installing into real b12x (the copy flashinfer-python ships) on a CPU machine."""

from __future__ import annotations

import gc
import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.fake_b12x import use_fork_api
from support.hosts import L2, STOCK_BUFFER, seam_is_ours, stock_seam
from support.startups import active, installed

from flare_l2evict._b12x.proof import CreditBasis, SeamProof, StockBuffer, prove_seam
from flare_l2evict._errors import InstallError
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict._weights import WeightChoice
from flare_l2evict.tools._choose_weights import choose_weights, install

measurement = pytest.importorskip("b12x.preparation._measurement")


def basis(proof: SeamProof | None, fork: Callable[..., Any] | None = None) -> CreditBasis:
    """This device's figures for an installation made outside a start-up (no race jobs)."""
    return CreditBasis(L2, 1024, StockBuffer(STOCK_BUFFER, measured=False), 0, proof, fork)


def choice(device: str = "cpu") -> WeightChoice:
    return choose_weights({"w": torch.zeros(4096)}, device, window_bytes=1024)


def test_the_installed_b12x_passes_the_proof() -> None:
    proof = prove_seam()
    assert [original for _, original in proof.seams] == [stock_seam()]
    assert proof.bindings == ()  # stock b12x looks the seam up at call time everywhere
    assert proof.b12x_version or proof.flashinfer_version


def test_stock_seam_serves_this_device_and_defers_elsewhere() -> None:
    with install(choice(), basis(prove_seam())) as installation:
        assert installation.mechanism == "stock-seam"
        seam = measurement._l2_flush_fn
        assert seam_is_ours()
        handed = seam(torch.device("cpu"), enabled=True)
        assert isinstance(handed, EvictionHandle) and handed.eviction is installation.eviction
        # Disabled calls go to b12x's own function (which returns None).
        assert seam(torch.device("cuda", 3), enabled=False) is None
        assert seam(torch.device("cpu"), enabled=False) is None
        audit = installation.audit()
    (cpu,) = audit.devices
    assert (cpu.requested, cpu.served_by_weights, cpu.stock_buffers) == (1, 1, 0)


def test_restore_puts_stock_back_and_releases() -> None:
    with install(choice(), basis(prove_seam())) as installation:
        installation.restore()
        assert measurement._l2_flush_fn is stock_seam()
        assert installation.eviction.views() == ()
        assert installed() is None
        installation.restore()  # idempotent
        assert measurement._l2_flush_fn is stock_seam()


def test_installing_twice_is_refused_and_changes_nothing() -> None:
    with install(choice(), basis(prove_seam())) as first:
        seam = measurement._l2_flush_fn
        with pytest.raises(InstallError, match=r"Startup\(stock-seam, 'w' on cpu.*already active"):
            install(choice(), basis(prove_seam()))
        assert measurement._l2_flush_fn is seam
        assert installed() is first.startup


def test_the_proof_unwraps_an_installed_seam() -> None:
    with install(choice(), basis(prove_seam())):
        assert prove_seam().original is stock_seam()


def _race_asks_b12x() -> object:
    """What a race's sample asks for: b12x's own module looks its eviction up, as
    ``prepare_race_steps`` does, after a collection (a dropped handle is gone by then)."""
    gc.collect()
    return measurement._l2_flush_fn(torch.device("cpu"), enabled=True)


def _stock_answers() -> bool:
    """Stock's function answers: on a CPU it cannot size a buffer and raises, as on any CPU."""
    if seam_is_ours():
        return False
    with pytest.raises((RuntimeError, AssertionError, ValueError)):
        measurement._l2_flush_fn(torch.device("cpu"), enabled=True)
    return True


def test_races_read_the_weights_while_the_with_block_holds_the_installation() -> None:
    # Issue 38: `install(...)` as a statement dropped its handle, so stock b12x was back
    # before the race ran. Held by the `with` alone (no name bound), it lasts the block.
    chosen = choice()
    with install(chosen, basis(prove_seam())):
        handed = _race_asks_b12x()
        assert isinstance(handed, EvictionHandle), handed
        assert handed.eviction.source_name == "w"
        del handed
        assert isinstance(_race_asks_b12x(), EvictionHandle)
    assert _stock_answers() and active() is None


def test_a_with_block_that_raises_ends_the_installation() -> None:
    with pytest.raises(KeyError), install(choice(), basis(prove_seam())):
        assert seam_is_ours()
        raise KeyError("a race failed")
    assert _stock_answers() and active() is None


def test_the_bench_installs_for_its_with_block_only() -> None:
    from benchmarks.bench._run import _installed

    tensor = torch.zeros(32 * 1024 * 1024 // 4)
    with _installed(tensor, 16 * 1024 * 1024, torch.device("cpu"), L2) as installed_by_bench:
        handed = _race_asks_b12x()
        assert isinstance(handed, EvictionHandle) and handed.eviction is installed_by_bench.eviction
        del handed
    assert _stock_answers() and active() is None


def test_a_dropped_installation_warns_once_naming_it_and_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="flare_l2evict"):
        with pytest.warns(ResourceWarning, match=r"implicitly ended Startup\(stock-seam") as got:
            install(choice(), basis(prove_seam()))  # the handle is dropped at once
            gc.collect()
    assert len([w for w in got if w.category is ResourceWarning]) == 1  # besides the line
    dropped = [r for r in caplog.records if "dropped without end()" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].levelno == logging.WARNING
    assert "Startup(stock-seam, 'w' on cpu" in dropped[0].getMessage()
    assert "with install(" in dropped[0].getMessage()
    assert _stock_answers() and active() is None


def test_an_ended_installation_dropped_later_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="flare_l2evict"):
        with install(choice(), basis(prove_seam())) as installation:
            pass
        installation.end()  # ending again changes nothing
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)  # raised here if one were warned
            del installation
            gc.collect()
    assert "dropped" not in caplog.text and active() is None


def test_a_changed_seam_is_left_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed_l2_flush_fn_stand_in(
        device: object, enabled: bool = True, window: object = None
    ) -> None:
        return None

    monkeypatch.setattr(measurement, "_l2_flush_fn", changed_l2_flush_fn_stand_in)
    with pytest.raises(InstallError, match=r"not \(device, \*, enabled\)"):
        prove_seam()
    assert measurement._l2_flush_fn is changed_l2_flush_fn_stand_in


def test_a_missing_seam_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(measurement, "_l2_flush_fn")
    with pytest.raises(InstallError, match="_l2_flush_fn is missing"):
        prove_seam()


def test_missing_b12x_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "b12x.preparation._measurement", None)
    with pytest.raises(InstallError, match=r"has no b12x.preparation._measurement.*pip install"):
        prove_seam()


def test_fork_api_is_preferred_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[object] = []
    fork_stand_in = use_fork_api(monkeypatch, handed.append)
    with install(choice(), basis(None, fork=fork_stand_in.use_startup_eviction)) as installation:
        assert installation.mechanism == "fork"
        assert isinstance(handed[0], torch.Tensor) and handed[0].nbytes == 1024
        assert measurement._l2_flush_fn is stock_seam()  # the stock seam is not touched
        assert not installation.audit().counted
        installation.restore()
        assert handed[-1] is None


def test_a_fork_api_of_another_shape_is_refused_before_anything_is_handed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 27: the fork row's signature is checked too, as the stock row's is.
    from flare_l2evict._b12x.proof import measure_basis
    from flare_l2evict._errors import InstallError
    from flare_l2evict._settings import L2EvictSettings

    handed: list[object] = []

    def fork_of_another_shape_stand_in(storage: object, stream: object) -> None:
        handed.append(storage)

    use_fork_api(monkeypatch, fork_of_another_shape_stand_in)
    with pytest.raises(
        InstallError, match=r"use_startup_eviction has signature .* not \(storage\)"
    ):
        measure_basis(torch.device("cpu"), L2, L2EvictSettings(), 1)
    assert handed == [] and measurement._l2_flush_fn is stock_seam()


@pytest.mark.parametrize("how", ["nested", "after-its-exit"])
def test_a_tools_install_entered_twice_refuses_the_second_entry_and_keeps_the_first(
    how: str,
) -> None:
    # Issue 41: `with handle:` inside `with install(...) as handle:` ran, and its exit ended
    # the outer block's install without a word; the races after it ran stock.
    from flare_l2evict import L2EvictError
    from flare_l2evict._startup import Startup

    outer = install(choice(), basis(prove_seam()))
    with outer as handle:
        assert seam_is_ours()
        if how == "nested":
            with pytest.raises(L2EvictError, match="already entered") as raised:
                with handle:
                    pass
            assert "\n" not in str(raised.value)
            assert "fix: make a new install(...) for each with statement" in str(raised.value)
        assert seam_is_ours() and Startup.active() is handle.startup  # the first entry stands
    assert not seam_is_ours() and Startup.active() is None  # its own exit ended it
    if how == "after-its-exit":
        with pytest.raises(L2EvictError, match="already entered"):
            with outer:
                pass
