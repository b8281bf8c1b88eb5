"""The bench's arithmetic and tables, on a CPU, from made-up raw figures; and its command line.

The GPU measures; what is judged from the measurements (coldness normalised
per repeat, the verdict against the spread, ncu's CSV, the tables) is plain
Python and is checked here with figures whose answers are known. The bench
runs from a checkout as ``python -m benchmarks.bench`` (it is not in the wheel).
"""

# ruff: noqa: E501  (ncu's CSV lines, kept as ncu writes them)
from __future__ import annotations

import math
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.bench import _coldness
from benchmarks.bench._command import main
from benchmarks.bench._hook_cost import hook_lines, hook_times, triton_lines
from benchmarks.bench._run import judge_coldness, summary_table

ROOT = Path(__file__).resolve().parents[1]

NCU_CSV = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "flare_probe": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum"
"","","","","","","","","","","","byte"
"0","4242","python3.12","127.0.0.1","flare_probe","1","7","(256, 1, 1)","(960, 1, 1)","0","9.0","7,864,320"
"1","4242","python3.12","127.0.0.1","flare_probe","1","7","(256, 1, 1)","(960, 1, 1)","0","9.0","1,024"
==PROF== Disconnected from process 4242
"""


def test_ncu_csv_values_in_launch_order() -> None:
    assert _coldness.parse_ncu_csv(NCU_CSV, "dram__bytes_read.sum") == [7_864_320.0, 1_024.0]
    assert _coldness.parse_ncu_csv(NCU_CSV, "lts__t_sector_hit_rate.pct") == []


def test_ncu_csv_scaled_units_are_honoured() -> None:
    text = NCU_CSV.replace('"byte"', '"Kbyte"').replace('"7,864,320"', '"7,864.32"')
    assert _coldness.parse_ncu_csv(text, "dram__bytes_read.sum")[0] == pytest.approx(7_864_320)


def test_physical_coldness_is_hbm_bytes_over_probe_bytes() -> None:
    rows = [
        {"probe": "0.125", "condition": "stock", "probe_bytes": 1000, "value": 990.0},
        {"probe": "0.125", "condition": "warm", "probe_bytes": 1000, "value": 10.0},
        {"probe": "0.125", "condition": "stock", "probe_bytes": 1000, "value": 1000.0},
    ]
    assert _coldness.physical(rows, "dram__bytes_read.sum") == {
        "0.125": {"stock": [0.99, 1.0], "warm": [0.01]}
    }
    hits = [{**rows[0], "value": 3.5}]
    assert _coldness.physical(hits, "lts__t_sector_hit_rate.pct")["0.125"]["stock"] == [3.5]


def timed_run(plugin_us: float) -> dict[str, Any]:
    """One process's raw figures: warm 10 us, reference 12 us, stock 12 us, three repeats."""
    us = {
        "warm": [10.0, 10.0, 10.0],
        "cold_1gib": [12.0, 12.0, 12.0],
        "stock": [12.0, 11.96, 12.04],
        "triton": [plugin_us] * 3,
        "torch": [12.0, 12.0, 12.0],
    }
    for factor in (0.5, 0.75, 1.0, 1.5, 3.0):
        us[f"stock@{factor}"] = [12.0] * 3
        us[f"triton@{factor}"] = [11.0 if factor < 1 else 12.0] * 3
    return {"pid": 1, "methods": {"spacer": {"0.125": {"probe_bytes": 4, "us": us}}}}


def test_coldness_is_normalised_per_repeat_and_judged_against_the_spread() -> None:
    rows = _coldness.timed_coldness(timed_run(11.9), "spacer")["0.125"]
    assert rows["warm"]["median"] == 0 and rows["cold_1gib"]["median"] == 1
    assert rows["stock"]["values"] == pytest.approx([1.0, 0.98, 1.02])
    assert rows["triton"]["median"] == pytest.approx(0.95)
    judged = _coldness.verdict(rows["stock"], rows["triton"])
    assert judged["spread"] == pytest.approx(0.04)
    assert judged["as_cold"] is False  # 0.95 < 1.0 - 0.04
    assert _coldness.verdict(rows["stock"], rows["torch"])["as_cold"] is True


def result_for(plugin_us: float) -> dict[str, Any]:
    def spread(values: list[float]) -> dict[str, Any]:
        return {"values": values, **_coldness.spread(values)}

    runs = [timed_run(plugin_us), {"error": "exit 1: a process that failed is shown, not hidden"}]
    ncu = [
        {
            "metric": "dram__bytes_read.sum",
            "process": 1,
            "rows": [
                {"probe": "0.125", "condition": c, "probe_bytes": 100, "value": v}
                for c, v in (("warm", 1.0), ("stock", 100.0), ("triton", 99.0), ("torch", 97.0))
            ],
        },
        {"metric": "lts__t_sector_hit_rate.pct", "process": 1, "error": "ncu exit 1: no counters"},
    ]
    us = {
        name: spread(values)
        for name, values in {
            "floor": [29.5, 29.4, 29.5],
            "stock": [38.9] * 3,
            "plugin": [32.9] * 3,
            "plugin_torch": [35.8] * 3,
            "plugin_1mib": [3.7] * 3,
            "plugin_torch_1mib": [4.0] * 3,
            "stock_1mib": [4.5] * 3,
        }.items()
    }
    limit = {
        name: {
            "limit_us": spread([29.5 + one] * 3),
            "excess_us": spread([us[name]["median"] - 29.5 - one] * 3),
            "under": us[name]["median"] - 29.5 - one <= 0,
        }
        for name, one in (("stock", 4.5), ("plugin", 3.7), ("plugin_torch", 4.0))
    }
    races = {"plugin": 36, "stock_b": 36, "none": 18}
    return {
        "gpu": "NVIDIA H200",
        "l2_bytes": 60 << 20,
        "torch": "2.11.0",
        "b12x": "1.5.1",
        "repeats": 3,
        "memory": {
            "stock": {"held_bytes": 125_829_632, "peak_bytes": 125_832_704},
            "plugin": {"held_bytes": 0, "peak_bytes": 0},
        },
        "cost": {
            "plugin_kernel": "triton",
            "hbm_read_bytes_per_s": 4.27e12,
            "us": us,
            "over_floor": {n: spread([us[n]["median"] / 29.5] * 3) for n in limit},
            "over_floor_plus_launch": limit,
        },
        "coldness": judge_coldness(runs, ncu),
        "calibrated": {"factor": 1.0, "window_bytes": 60 << 20},
        "races": {
            "races": [{}] * 36,
            "summary": {
                way: {
                    "agree_with_stock_per_repeat": [agree] * 3,
                    "mean_regret": 0.0,
                    "max_regret": 0.0,
                    "mean_best_latency_ratio": 1.0,
                    "min_best_latency_ratio": 1.0,
                }
                for way, agree in races.items()
            },
        },
        "hook_cost": [],
        "hook_times": [
            {
                "host_runs_triton": True,
                "triton_cache": "warm",
                "samples": [
                    {"hook_s": 0.12, "seconds": {"seam": 0.05, "total": 0.11}, "read_kernel": "t"}
                ],
            }
        ],
        "triton_start": [{"triton_cache": "empty", "samples": [{"error": "exit 1: no GPU"}]}],
        "startup_cost_ms": {"evictions": 5189, "stock": 201.9, "plugin": 170.7},
    }


@pytest.mark.parametrize(("plugin_us", "held"), [(11.9, 0), (12.0, 1)])
def test_summary_reports_every_process_and_the_limit(plugin_us: float, held: int) -> None:
    table = summary_table(result_for(plugin_us))
    assert f"at every probe in {held} of 1 fresh processes" in table
    assert "process 2: exit 1: a process that failed is shown" in table
    timed = next(line for line in table.splitlines() if "(timed, spacer) process 1" in line)
    assert ("triton LESS COLD (-0.050, spread 0.040)" in timed) is (held == 0)
    assert ("triton as cold (+0.000, spread 0.040)" in timed) is (held == 1)
    assert "stock 1.000 [1.000-1.000]  triton 0.990 [0.990-0.990]  torch 0.970" in table
    assert "ncu exit 1: no counters" in table
    assert "2 coldness (ncu; HBM bytes the probe re-reads / its size, 1 = none left in L2): " \
        "plugin as cold as stock at every probe in 0 of 1 fresh processes" in table  # fmt: skip
    # Under the limit: 32.9 us against 29.5 + 3.7; over it: 38.9 against 29.5 + 4.5.
    assert "plugin (triton): 32.9 [32.9-32.9] us against floor + one launch" in table
    assert "under it in every repeat" in table and "over it in 3 of 3 repeats" in table
    assert "6 hook host runs Triton, cache warm : hook 120.0 [120.0-120.0] ms" in table
    assert "seam 50.0 [50.0-50.0]" in table
    assert "6 cache empty: exit 1: no GPU" in table


def test_hook_lines_say_when_the_plugin_reports_no_steps() -> None:
    rows = [
        {
            "host_runs_triton": False,
            "triton_cache": "empty",
            "samples": [
                {
                    "hook_s": 0.5,
                    "seconds": {},
                    "read_kernel": "torch",
                    "host_s": {"import_plugin": 0.25},
                }
            ],
        }
    ]
    (line,) = hook_lines(rows)
    assert "hook 500.0 [500.0-500.0] ms" in line and "the plugin reports none" in line
    assert line.endswith("before the hook, importing the plugin took 250.0 [250.0-250.0] ms")
    assert triton_lines([{"triton_cache": "warm", "samples": [{"import_triton": 0.17}]}]) == [
        "Triton start, cache warm  (ms): import_triton 170.0 [170.0-170.0]"
    ]


@pytest.mark.slow  # fresh interpreters, each a start-up
def test_hook_times_runs_the_real_hook_in_fresh_processes_on_a_cpu() -> None:
    """The harness end to end on a CPU: a real start-up, its report's steps, every sample kept."""
    pytest.importorskip("b12x.preparation._measurement")
    rows = hook_times("cpu", samples=2, modes=[(False, "empty")], log=lambda _line: None)
    (row,) = rows
    assert len(row["samples"]) == 2
    for sample in row["samples"]:
        assert "error" not in sample, sample
        assert sample["reclaimed_bytes"] > 0 and sample["read_kernel"] == "torch"
        assert 0 < sample["hook_s"] < 60 and not sample["triton_imported_after_hook"]
        if sample["seconds"]:  # the plugin's own breakdown, where it reports one
            assert math.isclose(sum(v for k, v in sample["seconds"].items() if k != "total"),
                                sample["seconds"]["total"], rel_tol=0.2, abs_tol=0.005)  # fmt: skip
    assert "2 fresh processes" in hook_lines(rows)[0]


def test_ncu_counts_equal_to_a_few_hundred_bytes_are_as_cold() -> None:
    """Exact counts have no range; a difference below the launch's own traffic is no verdict."""
    probe = 7_864_320
    rows = [
        {"probe": "0.125", "condition": c, "probe_bytes": probe, "value": v}
        for c, v in (("stock", probe + 512.0), ("triton", probe + 0.0), ("torch", probe - 3840.0))
    ]
    got = [{"metric": "dram__bytes_read.sum", "process": 1, "rows": rows}]
    assert _coldness.ncu_held(got) == [True]
    rows[2]["value"] = probe * 0.99  # 1% of the probe left in L2: less cold
    assert _coldness.ncu_held(got) == [False]


def test_races_only_summary_reports_every_repeat() -> None:
    from benchmarks.bench._run import race_summary

    stock, warm_pick = (10.0, 20.0), (30.0, 15.0)  # warm, candidate 1 wins: 20 under stock's
    misses = [{0}, set(), {0}]  # per repeat, the races where no eviction picks candidate 1
    rows = [
        {
            "shape": [1, 2048, 2048],
            "repeats": [
                {"stock_a": stock, "plugin": stock, "stock_b": stock,
                 "none": warm_pick if race in missed else stock}
                for missed in misses
            ],
        }
        for race in range(2)
    ]  # fmt: skip
    races = {"races": rows, "summary": race_summary(rows, 3), "cute_guard_stand_in": True}
    result = {
        "gpu": "NVIDIA H200", "l2_bytes": 60 << 20, "torch": "2.11", "b12x": "1.5.1",
        "repeats": 3, "races": races, "seconds": {"races": 271.5},
    }  # fmt: skip
    table = summary_table(result)
    assert "4 races (2)  no eviction: picks stock's winner in 1, 2, 1 of 2" in table
    assert "regret mean 33.33% (per repeat 50.00%, 0.00%, 50.00%) max 100.00%" in table
    assert "4 races (2)       plugin: picks stock's winner in 2, 2, 2 of 2" in table
    assert "4 races ran under b12x's no_compilation() with b12x._lib.compiler stood in" in table
    assert "wall time (s): races 271.5" in table
    assert "1 memory" not in table and "3 eviction" not in table and "7 start-up" not in table


@pytest.mark.gpu
def test_bench_runs_only_the_races_it_is_asked_for(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--only races`` on a GPU: two races, one repeat, and no other section."""
    import json

    out = tmp_path / "bench"
    argv = ["--only", "races", "--races", "2", "--repeats", "1", "--out", str(out)]
    assert main(argv) == 0
    printed, log = capsys.readouterr()
    print(printed)
    assert "4 races (2)       plugin: picks stock's winner in" in printed
    assert "4 races ran under b12x's no_compilation()" in printed
    assert "plot: none (no coldness section)" in printed
    assert "race 2/2 " in log and "races done in" in log
    result = json.loads((out / "bench.json").read_text())
    assert result["sections"] == ["races"] and set(result["seconds"]) == {"races"}
    assert len(result["races"]["races"]) == 2
    assert not {"memory", "cost", "coldness", "hook_cost"} & set(result)


def test_bench_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = main([])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(
        "error: python -m benchmarks.bench: needs a CUDA device (no --device given, and the "
        "default cuda:0 is not available: no CUDA here); fix: run it on a GPU machine"
    )
    code = main(["--device", "cuda:0"])
    err = capsys.readouterr().err
    assert code == 2 and "(--device cuda:0 given, but CUDA is not available here)" in err


def test_bench_leaves_a_sigterm_its_caller_ignores_ignored(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 46: the bench set its SIGTERM handler even where the caller ignored SIGTERM (a
    # run started with `&` from a script, nohup). It runs on the CLI's runner now.
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the bench would run in full")
    changed: list[int] = []
    real = signal.signal

    def recorded(number: int, handler: Any) -> Any:
        changed.append(number)
        return real(number, handler)

    inherited = real(signal.SIGTERM, signal.SIG_IGN)
    try:
        monkeypatch.setattr(signal, "signal", recorded)
        code = main([])
        monkeypatch.undo()
        after = signal.getsignal(signal.SIGTERM)
    finally:
        real(signal.SIGTERM, inherited)
    assert code == 2 and "needs a CUDA device" in capsys.readouterr().err
    assert signal.SIGTERM not in changed and after is signal.SIG_IGN


@pytest.mark.parametrize(
    ("argv", "cause"),
    [
        (["--only", "everything"], "argument --only: invalid choice: 'everything'"),
        (["--races", "37"], "argument --races: '37' must be between 1 and 36"),
        (["--repeats", "x"], "argument --repeats: 'x' is not a whole number"),
        (["--device", "gpu0"], "argument --device: 'gpu0' is not a device"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bench_usage_errors_are_one_line_with_the_fix_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], cause: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert err.startswith(f"error: python -m benchmarks.bench: {cause}")
    assert err.endswith("; fix: see python -m benchmarks.bench --help\n")
    assert err.count("\n") == 1 and "usage:" not in err


@pytest.mark.slow  # a fresh interpreter that imports the bench's command line
def test_bench_runs_from_the_checkout_with_argparse_help() -> None:
    """As BENCHMARKS.md and scripts/gpu_suite.sh run it: ``python -m`` from the root."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("usage: python -m benchmarks.bench") and "options:" in done.stdout
    for flag in ("--device", "--out", "--repetitions", "--races", "--repeats", "--only", "--json"):
        assert flag in done.stdout
