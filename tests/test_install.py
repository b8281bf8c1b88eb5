"""Installing into real b12x (the copy flashinfer-python ships) on a CPU machine."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.hosts import L2, STOCK_BUFFER, seam_is_ours, stock_seam
from support.startups import installed

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
    installation = install(choice(), basis(prove_seam()))
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
    installation = install(choice(), basis(prove_seam()))
    installation.restore()
    assert measurement._l2_flush_fn is stock_seam()
    assert installation.eviction.views() == ()
    assert installed() is None
    installation.restore()  # idempotent
    assert measurement._l2_flush_fn is stock_seam()


def test_installing_twice_is_refused_and_changes_nothing() -> None:
    first = install(choice(), basis(prove_seam()))
    seam = measurement._l2_flush_fn
    with pytest.raises(InstallError, match=r"Startup\(stock-seam, 'w' on cpu.*already active"):
        install(choice(), basis(prove_seam()))
    assert measurement._l2_flush_fn is seam
    assert installed() is first.startup


def test_the_proof_unwraps_an_installed_seam() -> None:
    install(choice(), basis(prove_seam()))
    assert prove_seam().original is stock_seam()


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
    fork_stand_in = types.ModuleType("b12x.comm.pcie")
    fork_stand_in.use_startup_eviction = handed.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "b12x.comm.pcie", fork_stand_in)
    installation = install(choice(), basis(None, fork=fork_stand_in.use_startup_eviction))
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

    fork_stand_in = types.ModuleType("b12x.comm.pcie")
    fork_stand_in.use_startup_eviction = fork_of_another_shape_stand_in  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "b12x.comm.pcie", fork_stand_in)
    with pytest.raises(
        InstallError, match=r"use_startup_eviction has signature .* not \(storage\)"
    ):
        measure_basis(torch.device("cpu"), L2, L2EvictSettings(), 1)
    assert handed == [] and measurement._l2_flush_fn is stock_seam()
