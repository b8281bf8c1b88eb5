"""Installing into real b12x (the copy flashinfer-python ships) on a CPU machine."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import flare_l2evict
from flare_l2evict import InstallError, WeightEviction, choose_source, install

measurement = pytest.importorskip("b12x.preparation._measurement")
STOCK = measurement._l2_flush_fn


def eviction(device: str = "cpu") -> WeightEviction:
    return WeightEviction(choose_source({"w": torch.zeros(4096)}, device, window_bytes=1024))


def test_stock_seam_serves_this_device_and_defers_elsewhere() -> None:
    ours = eviction()
    installation = install(ours)
    assert installation.mechanism == "stock-seam"
    seam = measurement._l2_flush_fn
    assert seam is not STOCK
    assert seam(torch.device("cpu"), enabled=True) is ours
    # Other devices and enabled=False go to b12x's own function (which returns None here).
    assert seam(torch.device("cuda", 3), enabled=False) is None
    assert seam(torch.device("cpu"), enabled=False) is None


def test_prepare_race_steps_looks_the_seam_up_at_call_time() -> None:
    # The seam is only useful because b12x resolves the module global per call.
    import inspect

    source = inspect.getsource(measurement.prepare_race_steps)
    assert "_l2_flush_fn(" in source
    from b12x.preparation import session

    assert "from ._measurement import _l2_flush_fn" in inspect.getsource(
        session.PreparationJob._measure
    )


def test_restore_puts_stock_back_and_releases() -> None:
    ours = eviction()
    installation = install(ours)
    installation.restore()
    assert measurement._l2_flush_fn is STOCK
    assert ours.released
    assert flare_l2evict.active_installation() is None
    installation.restore()  # idempotent
    assert measurement._l2_flush_fn is STOCK


def test_installing_twice_is_a_no_op() -> None:
    first = install(eviction())
    seam = measurement._l2_flush_fn
    assert install(eviction()) is first
    assert measurement._l2_flush_fn is seam


def test_a_changed_seam_is_left_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed_l2_flush_fn_stand_in(device, enabled=True, window=None):
        return None

    monkeypatch.setattr(measurement, "_l2_flush_fn", changed_l2_flush_fn_stand_in)
    with pytest.raises(InstallError, match=r"not \(device, \*, enabled\)"):
        install(eviction())
    assert measurement._l2_flush_fn is changed_l2_flush_fn_stand_in


def test_a_missing_seam_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(measurement, "_l2_flush_fn")
    with pytest.raises(InstallError, match="_l2_flush_fn is missing"):
        install(eviction())


def test_missing_b12x_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "b12x.preparation._measurement", None)
    with pytest.raises(InstallError, match=r"b12x is not importable.*pip install"):
        install(eviction())


def test_fork_api_is_preferred_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[object] = []
    fork_stand_in = types.ModuleType("b12x.comm.pcie")
    fork_stand_in.use_startup_eviction = handed.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "b12x.comm.pcie", fork_stand_in)
    ours = eviction()
    installation = install(ours)
    assert installation.mechanism == "fork"
    assert isinstance(handed[0], torch.Tensor) and handed[0].nbytes == 1024
    assert measurement._l2_flush_fn is STOCK  # the stock seam is not touched
    installation.restore()
    assert handed[-1] is None
