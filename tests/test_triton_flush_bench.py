"""``benchmarks/triton_flush.py`` off a GPU: its command line, its refusals and its table.

The measurements need one CUDA GPU with Triton (BENCHMARKS.md); here, what runs anywhere:
``--help``, a usage error or a missing GPU as one line with exit 2, and the agreement table
from given picks.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from benchmarks import triton_flush
from benchmarks.triton_flush import Arm, agreements, by_kind, choices_table, spread

PROG = "python benchmarks/triton_flush.py"


def test_help_runs_without_a_gpu_and_names_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        triton_flush.main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and out.startswith(f"usage: {PROG}")
    for flag in ("--device", "--repeats", "--rep", "--warmup", "--scratch", "--window"):
        assert flag in out


@pytest.mark.parametrize(
    ("argv", "cause"),
    [
        (["--scratch", "0"], "argument --scratch: '0' is not a factor of the L2 in (0, 8]"),
        (["--repeats", "0"], "argument --repeats: "),
    ],
)
def test_a_usage_error_is_one_line_with_the_fix_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], cause: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        triton_flush.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {PROG}: {cause}")
    assert err.endswith(f"; fix: see {PROG} --help\n")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_no_gpu_is_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        triton_flush.main([])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {PROG}: needs a CUDA GPU, and torch sees none; fix: run it on a GPU machine\n"
    )


def test_the_table_counts_agreements_per_repeat_and_per_kind() -> None:
    kinds = ["matmul", "matmul", "memory", "window"]
    reference = [0, 1, 2, 3]
    assert agreements(reference, [0, 1, 5, 3]) == 3
    assert by_kind(kinds, reference, [0, 4, 5, 3]) == "matmul 1/2, memory 0/1, window 1/1"
    arm = Arm("plugin 1.0 x L2", contextlib.nullcontext, [[0, 1, 2, 3], [0, 1, 5, 5]])
    table = choices_table(kinds, reference, [arm]).splitlines()
    assert table[0].startswith("arm ") and "agreements out of 4 per repeat" in table[0]
    assert table[1].startswith("plugin 1.0 x L2         4  2")
    assert table[1].endswith(
        "matmul 2/2, memory 1/1, window 1/1; matmul 2/2, memory 0/1, window 0/1"
    )


def test_the_spread_is_median_min_and_max() -> None:
    assert spread([3.0, 1.0, 2.0]) == "2.0 [1.0-3.0] us"
    assert spread([]) == "-"
