"""Fault injection: fake b12x releases on disk; the credit never exceeds what the races saved."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from support.fake_b12x import (
    SESSION_BOUND_AT_IMPORT,
    SESSION_NEW_MODULE,
    job_evictions,
    use_fake,
    write_fake,
    write_moved_fake,
)
from support.hosts import JOBS, L2, PM, hook, runtime, weights
from support.startups import end_any, installed

from flare_l2evict import ReclaimReport, StartupAudit
from flare_l2evict._b12x import table as _seam_table
from flare_l2evict._credit import CREDIT_OVERHEAD_BYTES
from flare_l2evict._eviction import EvictionHandle


def start(
    tensors: dict[str, torch.Tensor],
    seam: str = "preparation._measurement",
) -> tuple[ReclaimReport, int, list[Callable[[], object]], StartupAudit]:
    """The plugin's hook, then the fake's race jobs; returns (report, bytes the races saved)."""
    measurement: Any = importlib.import_module(f"b12x.{seam}")
    job_evictions(JOBS)  # stock: what the jobs allocate without the plugin
    stock_bytes = sum(measurement.ALLOCATED)
    measurement.ALLOCATED.clear()
    host = runtime(tensors=tensors)  # the fakes' L2 is the shared host's
    report = hook(host)
    measurement.ALLOCATED.clear()  # the proof's own measurement is freed before the races
    evictions = job_evictions(JOBS)
    saved = stock_bytes - sum(measurement.ALLOCATED)
    audit = PM.hook.startup_complete(runtime=host)[0]
    return report, saved, evictions, audit


@pytest.fixture
def resident() -> dict[str, torch.Tensor]:
    """A fresh mapping of the shared host's weights, for each test."""
    return weights()


def test_stock_shaped_fake_is_served_and_credited_exactly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
) -> None:
    use_fake(monkeypatch, write_fake(tmp_path, l2=L2))
    report, saved, evictions, audit = start(resident)
    assert all(isinstance(e, EvictionHandle) for e in evictions)
    assert report.reclaimed_bytes == saved - CREDIT_OVERHEAD_BYTES
    assert (audit.devices[0].served_by_weights, audit.shortfall_bytes) == (JOBS, 0)


def test_a_session_that_binds_the_seam_at_import_is_redirected_too(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
) -> None:
    use_fake(monkeypatch, write_fake(tmp_path, l2=L2, session=SESSION_BOUND_AT_IMPORT))
    report, saved, evictions, _ = start(resident)
    assert all(isinstance(e, EvictionHandle) for e in evictions)
    assert 0 < report.reclaimed_bytes <= saved
    session = __import__("b12x.preparation.session").preparation.session
    assert session._l2_flush_fn.__name__ == "_l2_flush_fn"
    assert not hasattr(session._l2_flush_fn, "__flare_l2evict__")  # restored at the end


def test_a_buffer_of_three_l2_is_measured_not_assumed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
) -> None:
    use_fake(monkeypatch, write_fake(tmp_path, l2=L2, factor=3))
    report, saved, _, _ = start(resident)
    assert report.stock_buffer_bytes == 3 * L2 + 4  # its buffer and its 0-d output
    assert 0 < report.reclaimed_bytes <= saved


def test_a_buffer_of_one_l2_is_credited_at_one_l2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
) -> None:
    # The formula would say 64 MiB per job; this release allocates 8 MiB.
    use_fake(monkeypatch, write_fake(tmp_path, l2=L2, factor=1))
    report, saved, _, _ = start(resident)
    assert report.stock_buffer_bytes == L2 + 4
    assert report.reclaimed_bytes <= saved


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ({"session": SESSION_NEW_MODULE}, "PreparationJob._measure no longer asks _l2_flush_fn"),
        ({"race_maker": "new module"}, "prepare_race_steps no longer asks _l2_flush_fn"),
        ({"seam_raises": True}, "raised RuntimeError: seam broken"),
    ],
    ids=["session-evicts-in-a-new-module", "race-evicts-in-a-new-module", "seam-raises"],
)
def test_a_release_the_plugin_cannot_serve_is_refused_and_credited_zero(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
    fault: dict[str, Any],
    reason: str,
) -> None:
    use_fake(monkeypatch, write_fake(tmp_path, l2=L2, **fault))
    host = runtime(tensors=resident)
    report = hook(host)
    assert report.reclaimed_bytes == 0 and reason in (report.reason or "")
    assert host.kv_allocator.reclaimed_bytes == 0
    assert installed() is None
    end_any()


def test_weights_freed_mid_startup_show_as_a_shortfall_in_the_audit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
    caplog: pytest.LogCaptureFixture,
) -> None:
    measurement = use_fake(monkeypatch, write_fake(tmp_path, l2=L2))
    host = runtime(tensors=resident)
    report = hook(host)
    measurement.ALLOCATED.clear()
    (eviction,) = job_evictions(1)
    next(iter(resident.values())).untyped_storage().resize_(0)
    eviction()  # the weights are gone: this race makes stock's buffer after all
    with caplog.at_level("INFO", logger="flare_l2evict"):
        audit = PM.hook.startup_complete(runtime=host)[0]
    (cpu,) = audit.devices
    assert (cpu.requested, cpu.served_by_weights, cpu.stock_buffers) == (1, 1, 1)
    assert cpu.stock_bytes == sum(measurement.ALLOCATED) == report.stock_buffer_bytes
    assert audit.shortfall_bytes == cpu.stock_bytes
    (line,) = [r for r in caplog.records if "audit" in r.getMessage()]
    assert (
        line.levelname == "WARNING" and f"SHORTFALL {cpu.stock_bytes:,} bytes" in line.getMessage()
    )


def test_a_release_whose_seam_moved_is_supported_by_adding_one_row(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
) -> None:
    """The seam is data: a release that moved it to another module and name needs one row."""
    use_fake(
        monkeypatch,
        write_moved_fake(tmp_path, l2=L2, module="_cold", function="_cold_l2"),
        seam="preparation._cold",
    )
    report, _, evictions, _ = start(resident, seam="preparation._cold")
    assert report.reclaimed_bytes == 0  # unknown to the table: refused, stock kept
    assert "b12x.preparation._measurement" in (report.reason or "")
    assert not any(isinstance(e, EvictionHandle) for e in evictions)
    moved = _seam_table.SeamRow(
        name="a b12x whose seam moved (fake)",
        kind="stock",
        module="preparation._cold",
        function="_cold_l2",
        signature=(("device", "POSITIONAL_OR_KEYWORD"), ("enabled", "KEYWORD_ONLY")),
        callers=(
            ("preparation._cold", "prepare_race_steps"),
            ("preparation.session", "PreparationJob._measure"),
        ),
        optional=(),
    )
    monkeypatch.setattr(_seam_table, "ROWS", (*_seam_table.ROWS, moved))  # the one change
    cold: Any = importlib.import_module("b12x.preparation._cold")
    evictions.clear()
    cold.ALLOCATED.clear()  # the refused start-up's stock buffers
    report, saved, evictions, audit = start(resident, seam="preparation._cold")
    assert all(isinstance(e, EvictionHandle) for e in evictions)
    assert report.reclaimed_bytes == saved - CREDIT_OVERHEAD_BYTES > 0
    assert (audit.devices[0].served_by_weights, audit.shortfall_bytes) == (JOBS, 0)
    assert not hasattr(cold._cold_l2, "__flare_l2evict__")  # restored at the end


def test_a_release_whose_seam_changed_its_signature_is_supported_by_adding_one_row(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
) -> None:
    """The calling convention is data too: a seam taking ``(*, enabled, device)`` is one row."""
    fake = write_moved_fake(tmp_path, l2=L2, module="_cold", function="_cold_l2", keywords=True)
    use_fake(monkeypatch, fake, seam="preparation._cold")
    report, _, evictions, _ = start(resident, seam="preparation._cold")
    assert report.reclaimed_bytes == 0 and not any(isinstance(e, EvictionHandle) for e in evictions)
    changed = _seam_table.SeamRow(
        name="a b12x whose seam moved and takes keywords only (fake)",
        kind="stock",
        module="preparation._cold",
        function="_cold_l2",
        signature=(("enabled", "KEYWORD_ONLY"), ("device", "KEYWORD_ONLY")),
        callers=(
            ("preparation._cold", "prepare_race_steps"),
            ("preparation.session", "PreparationJob._measure"),
        ),
        optional=(),
    )
    monkeypatch.setattr(_seam_table, "ROWS", (*_seam_table.ROWS, changed))  # the one change
    cold: Any = importlib.import_module("b12x.preparation._cold")
    evictions.clear()
    cold.ALLOCATED.clear()
    report, saved, evictions, audit = start(resident, seam="preparation._cold")
    assert all(isinstance(e, EvictionHandle) for e in evictions)
    assert report.reclaimed_bytes == saved - CREDIT_OVERHEAD_BYTES > 0
    assert (audit.devices[0].served_by_weights, audit.shortfall_bytes) == (JOBS, 0)
    assert cold._cold_l2(enabled=False, device=torch.device("cpu")) is None  # stock's again


def test_a_stock_buffer_that_cannot_be_sized_credits_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resident: dict[str, torch.Tensor],
) -> None:
    # The seam's call works, but its closure holds a tensor whose storage cannot be read:
    # what stock allocates is unknown, so no credit rests on the formula instead.
    root = write_fake(tmp_path, l2=L2)
    seam = root / "b12x" / "preparation" / "_measurement.py"
    opaque = (
        "\n    class Opaque(torch.Tensor):\n"
        "        def untyped_storage(self):\n"
        '            raise RuntimeError("no storage")\n\n'
        "    buffer = buffer.as_subclass(Opaque)\n\n"
        "    def flush():"
    )
    text = seam.read_text()
    assert text.count("\n    def flush():") == 1
    seam.write_text(text.replace("\n    def flush():", opaque))
    use_fake(monkeypatch, root)
    report = hook(runtime(tensors=resident))
    assert report.reclaimed_bytes == 0 and "no storage" in (report.reason or "")
    assert installed() is None
