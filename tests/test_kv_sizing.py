"""Two KV-sizing styles in the host contract (issue 35, item 1): ``runtime.kv_sizing``.

A *reserved* host (or one that says nothing) is offered the credit, as always. A
*measured* one sizes its KV cache from memory measured after the races: the eviction
is installed and kept until ``startup_complete``, nothing is offered (its measurement
already sees the bytes), and its report and one INFO line say why. Real pluggy, the
reference host on the CPU, and on a GPU real b12x races; ranks over gloo (every rank measures,
or only one) are in ``test_tp_gloo.py``, which spawns its ranks once for every scenario.
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.figures import KV_BYTES_PER_TOKEN as KV, OUTPUTS, OWN, MiB
from support.hosts import CREDIT, JOBS, L2, WEIGHT, complete, hook, seam, seam_is_ours, weights
from support.json_output import parsed
from support.startups import end_any, installed

from flare_l2evict._eviction import EvictionHandle
from flare_l2evict._startup import Phase, Startup
from flare_l2evict.tools import main
from flare_l2evict.tools.reference_host import ReferenceKVAllocator

_ABSENT = object()


class Host:
    """A host of the contract on the CPU, as small as docs/host-contract.md's: every
    attribute but ``kv_sizing`` and ``kv_allocator`` fixed, those two as given (or absent)."""

    device = torch.device("cpu")
    rank, world_size, process_group = 0, 1, None
    race_jobs, l2_cache_bytes = JOBS, L2

    def __init__(self, kv_sizing: object = _ABSENT, kv_allocator: object = _ABSENT) -> None:
        self.config: dict[str, Any] = {}
        self.tensors = weights()
        for name, value in (("kv_sizing", kv_sizing), ("kv_allocator", kv_allocator)):
            if value is not _ABSENT:
                setattr(self, name, value)

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        return self.tensors


class SizingStr(str):
    """A str subclass of the host's: not the text the contract names, though equal to it."""


@pytest.fixture(autouse=True)
def _ended() -> Iterator[None]:
    yield
    end_any()


def plugin_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "flare_l2evict"]


def test_a_measuring_host_is_installed_offered_nothing_and_told_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    allocator = ReferenceKVAllocator(1024)
    runtime = Host("measured", allocator)
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(runtime)
    assert report.reclaimed_bytes == 0 and report.kv_sizing == "measured"
    assert report.unallocated_bytes == CREDIT  # what a reserved host would have been credited
    assert report.mechanism == "stock-seam" and report.source_tensor == WEIGHT
    reason = report.reason or ""
    assert "runtime.kv_sizing = 'measured'" in reason and "count them twice" in reason
    assert f"{CREDIT:,} bytes the races no longer allocate" in reason
    (line,) = plugin_lines(caplog)  # one line, INFO: nothing went wrong
    assert line.levelno == logging.INFO and "\n" not in line.getMessage()
    assert line.getMessage().startswith("flare_l2evict: installed on cpu (rank 0) via stock-seam")
    assert reason in line.getMessage()
    assert allocator.reports == [] and allocator.reclaimed_bytes == 0  # never called
    active = installed()
    assert active is not None and active.phase is Phase.KEPT and seam_is_ours()
    # Until startup_complete, every race job's eviction reads the weights: no buffer made.
    flush: Any = seam()
    held = [flush(torch.device("cpu"), enabled=True) for _ in range(JOBS)]
    assert all(isinstance(handle, EvictionHandle) for handle in held)
    for handle in held:
        handle()
    audit = complete(runtime)
    (device,) = audit.devices
    assert (device.requested, device.served_by_weights, device.stock_buffers) == (JOBS, JOBS, 0)
    assert audit.credited_bytes == 0 and audit.peak_alive == JOBS and not audit.warns
    assert not seam_is_ours() and Startup.active() is None


@pytest.mark.parametrize("allocator", [None, _ABSENT], ids=["kv_allocator=None", "no kv_allocator"])
def test_a_measuring_host_needs_no_kv_allocator(allocator: object) -> None:
    runtime = Host("measured", allocator)
    report = hook(runtime)
    assert report.reclaimed_bytes == 0 and report.unallocated_bytes == CREDIT, report.reason
    assert report.allocator_error is None and seam_is_ours()
    complete(runtime)
    # A reserved host without one is still refused, and told the measured way out.
    report = hook(Host("reserved", allocator))
    assert report.reclaimed_bytes == report.unallocated_bytes == 0
    assert "runtime.kv_allocator" in (report.reason or "")
    assert "runtime.kv_sizing = 'measured'" in (report.reason or "")


@pytest.mark.parametrize("sizing", [_ABSENT, None, "reserved"], ids=["absent", "None", "reserved"])
def test_a_reserved_host_or_one_that_says_nothing_is_credited_as_before(sizing: object) -> None:
    allocator = ReferenceKVAllocator(1024)
    runtime = Host(sizing, allocator)
    report = hook(runtime)
    assert report.reclaimed_bytes == CREDIT == allocator.reclaimed_bytes
    assert allocator.reports == [report]
    assert report.kv_sizing == "reserved" and report.unallocated_bytes == 0
    assert report.reason is None
    active = installed()
    assert active is not None and active.phase is Phase.CREDITED
    complete(runtime)


@pytest.mark.parametrize(
    "value",
    ["Measured", "measured ", "", 1, True, b"measured", ["measured"], SizingStr("measured")],
    ids=repr,
)
def test_a_bad_kv_sizing_is_one_line_naming_it_and_credits_nothing(
    value: object, caplog: pytest.LogCaptureFixture
) -> None:
    allocator = ReferenceKVAllocator(1024)
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(Host(value, allocator))
    reason = report.reason or ""
    assert report.reclaimed_bytes == report.unallocated_bytes == 0 and report.mechanism == "none"
    assert reason.startswith("runtime.kv_sizing = ") and "'reserved'" in reason, reason
    assert "'measured'" in reason and "\n" not in reason
    (line,) = plugin_lines(caplog)
    assert line.levelno == logging.WARNING and reason in line.getMessage()
    assert allocator.reports == [] and installed() is None and not seam_is_ours()


def table_cells(line: str) -> list[str]:
    """A table row's cells: columns are at least two spaces apart, words in a cell one."""
    return re.split(r" {2,}", line.strip())


def startup(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``flare-l2evict startup`` on a small CPU profile (64 MiB windows, 3 race jobs)."""
    code = main(["startup", "--plugin", "l2evict", "--l2-mib", "8", "--race-jobs", "3", *argv])
    return code, capsys.readouterr().out


def test_startup_measured_raises_the_kv_tokens_through_measurement_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = startup(capsys, "--kv-sizing", "measured", "--json")
    assert code == 0
    figures = parsed("startup", out)
    without, with_ = figures["without"], figures["with"]
    stock = 3 * 64 * MiB
    assert without["kv_sizing"] == with_["kv_sizing"] == "measured"
    assert (without["measured_race_bytes"], with_["measured_race_bytes"]) == (stock, OUTPUTS)
    assert with_["reclaimed_bytes"] == with_["report"]["reclaimed_bytes"] == 0
    assert with_["report"]["unallocated_bytes"] == stock - OWN
    assert with_["kv_tokens"] > without["kv_tokens"]
    # The measurement sees what the races no longer hold: at least what a credit would be.
    gained = with_["kv_budget_bytes"] - without["kv_budget_bytes"]
    assert gained == stock - OUTPUTS >= with_["report"]["unallocated_bytes"]
    code, out = startup(capsys, "--kv-sizing", "measured")
    assert code == 0
    rows = {cells[0]: cells[1:] for cells in map(table_cells, out.splitlines()[5:])}
    assert "KV cache sized by measurement after the races" in out
    assert rows["Reclaimed (report)"] == ["-", "0 B"]
    assert rows["Unallocated (report)"] == ["-", f"{stock - OWN:,} B"]


def test_startup_reserved_is_the_default_and_credits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = startup(capsys, "--kv-sizing", "reserved", "--json")
    assert code == 0
    with_ = parsed("startup", out)["with"]
    assert with_["kv_sizing"] == "reserved" and with_["measured_race_bytes"] is None
    assert with_["reclaimed_bytes"] == 3 * 64 * MiB - OWN
    assert with_["report"]["unallocated_bytes"] == 0
    code, out = startup(capsys)
    assert code == 0 and "Unallocated" not in out and "measurement" not in out


def test_startup_measured_that_falls_back_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text('[plugins.l2evict]\nexclude = ["*"]\n')
    code, out = startup(capsys, "--kv-sizing", "measured", "--config", str(config), "--json")
    with_ = parsed("startup", out)["with"]
    assert code == 1 and with_["report"]["unallocated_bytes"] == 0
    assert with_["job_evictions"] == ["stock"] * 3


def test_a_bad_kv_sizing_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["startup", "--plugin", "l2evict", "--kv-sizing", "measure"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("error: flare-l2evict startup: argument --kv-sizing: ")
    assert "'measured'" in line and "; fix: " in line


@pytest.mark.gpu
def test_free_memory_after_real_b12x_races_stock_and_plugin_reserved_and_measured() -> None:
    """Four arms on a GPU: free memory after real b12x races, and the KV budget each sizes."""
    pytest.importorskip("b12x.preparation._measurement")
    from flare_l2evict._credit import stock_window_bytes
    from flare_l2evict.tools.reference_host import PROFILES, ReferenceHost, example_tensors

    device = torch.device("cuda", 0)
    l2 = int(torch.cuda.get_device_properties(device).L2_cache_size)
    tensors = example_tensors(stock_window_bytes(l2))
    arms = {}
    for sizing in ("reserved", "measured"):
        for name, plugins in (("stock", ()), ("plugin", ("l2evict",))):
            host = ReferenceHost(
                plugins=plugins,
                device=device,
                profile=PROFILES["h200"],
                kv_bytes_per_token=KV,
                kv_sizing=sizing,
            )
            arms[name, sizing] = host.start(tensors)
    print()  # under pytest -v -s the first line would follow the test's name
    for (name, sizing), arm in arms.items():
        print(
            f"kv sizing {sizing:>8}, {name:>6}: free after races "
            f"{arm.free_after_races_bytes or 0:,} B, race peak {arm.race_peak_bytes or 0:,} B, "
            f"KV budget {arm.kv_budget_bytes:,} B, credited {arm.reclaimed_bytes:,} B"
        )
    reserved, measured = arms["plugin", "reserved"], arms["plugin", "measured"]
    assert reserved.report is not None and measured.report is not None
    credit = reserved.report.reclaimed_bytes
    assert credit > 0 and measured.reclaimed_bytes == 0
    assert measured.report.unallocated_bytes == credit
    for sizing in ("reserved", "measured"):
        stock, plugin = arms["stock", sizing], arms["plugin", sizing]
        assert stock.free_after_races_bytes is not None
        assert plugin.free_after_races_bytes is not None
        assert plugin.free_after_races_bytes > stock.free_after_races_bytes, sizing
    # Reserved: the credit grows the budget. Measured: the races' lower peak does, by at
    # least as much (the credit is a lower bound of what they no longer allocate).
    assert reserved.kv_budget_bytes - arms["stock", "reserved"].kv_budget_bytes == credit
    assert measured.kv_budget_bytes - arms["stock", "measured"].kv_budget_bytes >= credit


class SizingEnum(str, enum.Enum):
    """A host's str Enum of sizing styles."""

    MEASURED = "measured"


@pytest.mark.parametrize(
    ("value", "kind"), [(SizingStr("measured"), "SizingStr"), (SizingEnum.MEASURED, "SizingEnum")]
)
def test_a_kv_sizing_equal_to_measured_but_no_plain_str_says_so(value: object, kind: str) -> None:
    # Issue 41: the refusal read "runtime.kv_sizing = 'measured': the host must pass ...
    # or 'measured'", as if 'measured' were refused.
    report = hook(Host(value, ReferenceKVAllocator(1024)))
    reason = report.reason or ""
    assert report.reclaimed_bytes == 0 and not seam_is_ours()
    assert reason.startswith(f"runtime.kv_sizing = 'measured' (a {kind}, not a str): "), reason


class CountingSizingHost(Host):
    """A host whose kv_sizing is a property that counts its reads."""

    reads = 0

    @property
    def kv_sizing(self) -> str:
        CountingSizingHost.reads += 1
        return "measured"


def test_kv_sizing_is_read_once_on_a_refused_path() -> None:
    # Issue 41: a refused start-up read runtime.kv_sizing a second time (for the agreement),
    # after the snapshot had read it once; the contract says once.
    CountingSizingHost.reads = 0
    host = CountingSizingHost(kv_allocator=ReferenceKVAllocator(1024))
    host.race_jobs = -1  # refused
    report = hook(host)
    assert report.reclaimed_bytes == 0 and (report.reason or "").startswith("runtime.race_jobs")
    assert report.kv_sizing == "measured"  # what the host said, for the agreement too
    assert CountingSizingHost.reads == 1


@pytest.mark.parametrize("free", [0, 100 * MiB], ids=["none-free", "less-than-the-credit"])
def test_the_free_memory_cap_bounds_a_credit_never_a_measuring_hosts_install(
    monkeypatch: pytest.MonkeyPatch, free: int
) -> None:
    # Issue 46: with nothing free on the device, the cap cut the figure to 0 and a measuring
    # host, which takes no credit, lost its install. A CPU has no free figure: the device's
    # reading stands in for one, as in test_credit.py.
    from flare_l2evict._b12x import proof

    monkeypatch.setattr(proof, "device_free_bytes", lambda device: free)
    allocator = ReferenceKVAllocator(1024)
    measuring = Host("measured", allocator)
    report = hook(measuring)
    assert report.reclaimed_bytes == 0 and report.unallocated_bytes == CREDIT
    assert report.mechanism == "stock-seam" and report.uncut_credit_bytes is None
    active = installed()
    assert active is not None and active.phase is Phase.KEPT and seam_is_ours()
    assert allocator.reports == []
    complete(measuring)
    reserving = Host("reserved", ReferenceKVAllocator(1024))
    report = hook(reserving)  # the same cap bounds a reserving host's credit
    assert report.reclaimed_bytes == free and report.uncut_credit_bytes == CREDIT
    assert (report.mechanism == "none") == (free == 0)
    complete(reserving)
