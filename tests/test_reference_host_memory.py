"""The reference host never takes a credit that memory on its device could not back, and says in
words when stock's buffers do not fit (issue 41): a credit past the device is an over-report,
whatever the arithmetic on paper.
"""

from __future__ import annotations

import logging

import pytest
from support.json_output import parsed

from flare_l2evict import ReclaimReport
from flare_l2evict.tools import main
from flare_l2evict.tools.reference_host import ReferenceKVAllocator


def _report(nbytes: int) -> ReclaimReport:
    return ReclaimReport(device="cpu", reclaimed_bytes=nbytes, mechanism="stock-seam")


def test_the_allocator_takes_no_more_than_the_memory_free_at_the_hook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    allocator = ReferenceKVAllocator(948, free_bytes=100 << 20, where="the test's device")
    with caplog.at_level(logging.WARNING, logger="flare_l2evict"):
        allocator.add_reclaimed(_report(150 << 20))
    assert allocator.reclaimed_bytes == 100 << 20 and allocator.cut_bytes == 50 << 20
    (line,) = caplog.messages
    assert line == (
        "flare_l2evict: reference host: the credit of 157,286,400 bytes is more than the "
        "104,857,600 bytes free on the test's device at before_first_capture; 104,857,600 "
        "bytes taken"
    )


def test_a_credit_within_the_free_memory_is_taken_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    allocator = ReferenceKVAllocator(948, free_bytes=100 << 20)
    with caplog.at_level(logging.WARNING, logger="flare_l2evict"):
        allocator.add_reclaimed(_report(100 << 20))
    assert allocator.reclaimed_bytes == 100 << 20 and allocator.cut_bytes == 0
    assert caplog.messages == []


def test_a_one_gib_device_takes_no_credit_past_its_memory_and_stock_runs_out_of_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["startup", "--plugin", "l2evict", "--memory-gib", "1", "--json"])
    figures = parsed("startup", capsys.readouterr().out)
    without, with_ = figures["without"], figures["with"]
    assert code == 0
    assert with_["free_at_hook_bytes"] == (1 << 30) - with_["loaded_bytes"]
    assert with_["reclaimed_bytes"] == with_["free_at_hook_bytes"]
    asked = with_["report"]["reclaimed_bytes"]
    assert with_["reclaimed_bytes"] + with_["credit_cut_bytes"] == asked
    assert with_["out_of_memory"] is None
    # Stock's five 256 MiB buffers cannot exist next to the checkpoint on 1 GiB: said in words,
    # and no KV cache is served, instead of a budget of 0 that reads like a figure.
    assert "do not fit the" in without["out_of_memory"]
    assert "the races run out of memory" in without["out_of_memory"]
    assert without["kv_budget_bytes"] == without["kv_tokens"] == 0
    assert without["credit_cut_bytes"] == 0


def test_the_table_says_out_of_memory_and_what_the_host_took(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["startup", "--plugin", "l2evict", "--memory-gib", "1"])
    out = capsys.readouterr().out
    labels = ("KV cache budget", "Reclaimed (report)", "Credit taken")
    rows = {
        label: line.removeprefix(label).split()
        for line in out.splitlines()
        for label in labels
        if line.startswith(label)
    }
    assert code == 0
    assert rows["KV cache budget"][:3] == ["out", "of", "memory"]
    assert rows["Reclaimed (report)"] == ["-", "1,340,046,848", "B"]
    assert rows["Credit taken"] == ["-", "724,940,800", "B", "(free", "at", "the", "hook)"]
    said = " ".join(out.split())
    assert (
        "note: without plugins: stock's 5 x 268,435,456-byte buffers (1,342,177,280 bytes) do not "
        "fit the 724,940,800 bytes free on the gb202 profile's device after the checkpoint: the "
        "races run out of memory" in said
    )


def test_race_jobs_takes_what_the_host_contract_takes(capsys: pytest.CaptureFixture[str]) -> None:
    # 0..1,024 as runtime.race_jobs: 0 is a host that races nothing, credited nothing.
    code = main(["startup", "--plugin", "l2evict", "--race-jobs", "0", "--json"])
    captured = capsys.readouterr()
    figures = parsed("startup", captured.out)
    assert code == 1 and figures["with"]["race_jobs"] == 0
    assert "nothing to reclaim: 0 race jobs" in captured.err
