"""The reference host's table shows one ``do_bench`` call's flush bytes (issue 47, item 4).

Case -> row (``flare-l2evict startup`` on the CPU; Triton is the vendored 3.6 ``do_bench``
and ``DriverConfig`` around a stand-in driver in ``sys.modules``, where a case needs it):

- the plugin served Triton's flush -> ``256 MiB`` without, the scratch's bytes with
  ``(reads weights)``; ``--json`` carries the same section;
- the host imported Triton, the plugin kept it stock -> ``256 MiB (stock)``, and a note why;
- no ``--plugin`` -> stock's bytes on both sides, no note;
- Triton not imported -> no Triton row: the README's table (byte-identical, tests/test_readme.py).
"""

from __future__ import annotations

import sys

import pytest
from support.json_output import parsed
from support.triton_stand_in import triton_imported

from flare_l2evict.tools.cli import main

SCRATCH = 134_217_728  # one L2 of the gb202 profile, the CPU's stand-in
ROW = "Triton flush per call"


def startup(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    main(["startup", *argv])
    return capsys.readouterr().out.splitlines()


def row(lines: list[str]) -> list[str]:
    """The Triton row's two cells, as the table spaces them apart."""
    (found,) = (line for line in lines if line.startswith(ROW))
    return [cell.strip() for cell in found.removeprefix(ROW).split("   ") if cell.strip()]


def test_a_served_flush_shows_the_scratch_against_stock_s_256_mib(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with triton_imported():
        lines = startup(capsys, "--plugin", "l2evict")
        figures = parsed("startup", "\n".join(startup(capsys, "--plugin", "l2evict", "--json")))
    assert row(lines) == ["256 MiB", f"{SCRATCH:,} B (reads weights)"]
    assert not any(line.startswith("note:") for line in lines)
    section = figures["with"]["report"]["triton"]
    assert section["installed"] and section["scratch_bytes"] == SCRATCH
    assert section["stock_bytes"] == 268_435_456 and section["version"] == "3.6.0"


def test_a_flush_kept_stock_shows_stock_s_bytes_and_a_note_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with triton_imported(cpu_served=False):
        lines = startup(capsys, "--plugin", "l2evict")
    assert row(lines) == ["256 MiB", "256 MiB (stock)"]
    notes = " ".join(lines[next(i for i, x in enumerate(lines) if x.startswith("note:")) :])
    assert notes == (
        "note: --plugin l2evict: Triton's flush stays stock: the weights are on cpu, not a "
        "CUDA device"
    )


def test_without_the_plugin_both_sides_are_stock_s(capsys: pytest.CaptureFixture[str]) -> None:
    with triton_imported():
        lines = startup(capsys)
    assert row(lines) == ["256 MiB", "256 MiB"]
    assert not any(line.startswith("note:") for line in lines)


def test_a_host_without_triton_has_no_triton_row(capsys: pytest.CaptureFixture[str]) -> None:
    if "triton" in sys.modules:
        pytest.skip("Triton is imported in this process")
    lines = startup(capsys, "--plugin", "l2evict")
    assert not any(line.startswith(ROW) for line in lines)
    assert not any("Triton" in line for line in lines)
