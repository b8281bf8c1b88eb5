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


_RESTORED_BEFORE_THE_END = """
import torch
import flare_l2evict
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator,
    ReferenceRuntime,
    plugin_manager,
)

MiB = 1 << 20
runtime = ReferenceRuntime(
    torch.device("cpu"),
    {"plugins": {"l2evict": {"window": "1MiB"}}},
    ReferenceKVAllocator(1024),
    2,
    32 * MiB,
    {"w": torch.ones(MiB)},
)
pm = plugin_manager(["l2evict"])
(report,) = pm.hook.before_first_capture(runtime=runtime)
assert report.reclaimed_bytes
flare_l2evict.restore()  # before startup_complete: any race after it is unseen, and stock
(audit,) = pm.hook.startup_complete(runtime=runtime)
print(audit.summary())
"""


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_an_audit_never_says_no_race_ran_and_that_races_used_the_credit() -> None:
    from support.python_child import run_python

    line = run_python(_RESTORED_BEFORE_THE_END).strip()
    assert "FELL BACK" in line and "SHORTFALL" in line, line
    assert "no race used the" not in line and "NO RACE RAN:" not in line, line
    assert "NO RACE RAN BEFORE THE FALLBACK: no eviction was asked between " in line, line


def test_an_audit_whose_races_all_got_stock_buffers_says_so() -> None:
    from flare_l2evict._report import DeviceAudit, StartupAudit

    audit = StartupAudit(
        mechanism="stock-seam",
        device="cuda:0",
        credited_bytes=5 << 28,
        race_jobs=5,
        peak_alive=0,
        unused_credit_bytes=5 << 28,
        devices=(
            DeviceAudit(
                device="cuda:1", requested=3, served_by_weights=0, stock_buffers=3, stock_bytes=3
            ),
        ),
    )
    line = audit.summary()
    assert "NO RACE RAN" not in line and "no race used" not in line, line
    assert "NO EVICTION READ THE WEIGHTS: the races asked 3 evictions, each " in line, line


def test_a_credit_cut_to_the_free_memory_says_so_in_the_report_and_the_audit() -> None:
    # Issue 41: on CUDA the credit never exceeds what was free to torch when the hook ran.
    from flare_l2evict._report import StartupAudit

    cut = full().model_copy(
        update={
            "device_free_bytes": 3 << 28,
            "reclaimed_bytes": 3 << 28,
            "uncut_credit_bytes": 5 << 28,
        }
    )
    line = cut.summary()
    assert "reclaimed 805,306,368 bytes on cuda:0" in line and "\n" not in line
    assert "CUT from 1,342,177,280 bytes to the 805,306,368 bytes free to torch on cuda:0" in line
    assert "CUT" not in full().summary()
    audit = StartupAudit(
        mechanism="fork",
        device="cuda:0",
        credited_bytes=3 << 28,
        counted=False,
        device_free_bytes=3 << 28,
        uncut_credit_bytes=5 << 28,
    )
    assert "credited 805,306,368 bytes (CUT from 1,342,177,280 to the 805,306,368 bytes free" in (
        audit.summary()
    )
    assert "CUT" not in audit.model_copy(update={"uncut_credit_bytes": None}).summary()
