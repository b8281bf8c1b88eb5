from __future__ import annotations

import pydantic
import pytest

from flare_l2evict import ReclaimReport, RegionRead


def full() -> ReclaimReport:
    return ReclaimReport(
        device="cuda:0",
        rank=1,
        world_size=4,
        reclaimed_bytes=5 * (256 << 20),
        local_reclaimed_bytes=5 * (256 << 20),
        mechanism="stock-seam",
        source_tensor="model.layers.3.mlp.experts.w13_weight",
        source_storage_bytes=300 << 20,
        sources=(
            RegionRead(tensor="model.layers.3.mlp.experts.w13_weight", storage_bytes=300 << 20),
        ),
        window_bytes=256 << 20,
        stock_buffer_bytes=256 << 20,
        race_jobs=5,
    )


def test_json_round_trip() -> None:
    report = full()
    assert ReclaimReport.model_validate_json(report.model_dump_json()) == report


def test_frozen() -> None:
    with pytest.raises(pydantic.ValidationError):
        full().reclaimed_bytes = 1


def test_schema_names_the_allocator_field() -> None:
    schema = ReclaimReport.model_json_schema()
    assert "reclaimed_bytes" in schema["required"]
    assert schema["properties"]["mechanism"]["enum"] == ["fork", "stock-seam", "none"]


def test_zero_needs_a_reason_and_bytes_need_a_mechanism() -> None:
    with pytest.raises(pydantic.ValidationError, match="must say why"):
        ReclaimReport(device="cpu", reclaimed_bytes=0, mechanism="none")
    with pytest.raises(pydantic.ValidationError, match="need a mechanism"):
        ReclaimReport(device="cpu", reclaimed_bytes=10, mechanism="none")
    with pytest.raises(pydantic.ValidationError):
        ReclaimReport(device="cpu", reclaimed_bytes=-1, mechanism="none", reason="x")


def test_summary_is_one_grep_able_line() -> None:
    line = full().summary()
    assert "\n" not in line
    assert "reclaimed 1,342,177,280 bytes on cuda:0" in line
