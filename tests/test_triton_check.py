"""``flare-l2evict check``'s Triton line and ``--json``'s ``triton`` (issue 47, item 4).

Case -> line (on this CPU machine; Triton is the vendored 3.6 ``do_bench`` and
``DriverConfig`` around a stand-in driver, set into ``sys.modules``, where a case needs it):

- Triton not installed -> ``triton: not installed``;
- ``triton = false`` -> ``triton: disabled by config (triton = false)``, nothing imported;
- the proof passes on a device the wing serves (the CPU standing in for CUDA) -> the
  scratch's bytes against stock's 268,435,456;
- off CUDA, with no driver to make -> the table's verdict, "judged by the table only";
  with a driver made -> the proof's, and stock on this device;
- another program's method on the driver -> stock, named;
- a Triton that fails to import -> one line, no traceback, the exit code b12x's alone.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.json_output import parsed
from support.triton_stand_in import CudaDriverStandIn, TritonModulesStandIn, triton_imported

from flare_l2evict.tools import main

STOCK = "Triton's flush stays stock"
SCRATCH = 134_217_728  # one L2 of the gb202 profile, check's stand-in for a CPU
SERVES = (
    f"do_bench's flush would read the weights, then zero a scratch of {SCRATCH:,} bytes per "
    "call (stock: 268,435,456)"
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU check: this one has CUDA")


def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], dict[str, Any]]:
    """``check --device cpu`` as text (its lines from the Triton one on), then as JSON."""
    code = main(["check", "--device", "cpu", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("triton: "))
    assert main(["check", "--device", "cpu", "--json", *argv]) == code
    return code, lines[at:], parsed("check", capsys.readouterr().out)["triton"]


def detail(lines: list[str]) -> str:
    """The indented lines under the first, joined as one."""
    under = []
    for line in lines[1:]:
        if not line.startswith("    "):
            break
        under.append(line.strip())
    return " ".join(under)


@pytest.fixture
def no_driver() -> Iterator[TritonModulesStandIn]:
    """Triton imported on a machine where its driver cannot be made (no GPU)."""
    with triton_imported(cpu_served=False) as made:

        def default(_self: object) -> object:
            raise RuntimeError("0 active drivers ([]). There should only be one.")

        type(made.config).default = property(default)  # this config's own class, made anew
        yield made


def test_check_names_triton_not_installed(capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("triton is installed here")
    code, lines, figures = check(capsys)
    assert lines[0] == f"triton: not installed: {STOCK}"
    assert code == 0
    assert figures == {
        "version": None,
        "judged": None,
        "would_install": False,
        "reason": f"triton is not installed: no do_bench to patch; {STOCK}",
        "scratch_bytes": 0,
    }


def test_triton_false_is_one_line_and_imports_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text("[plugins.l2evict]\ntriton = false\n")
    with triton_imported() as made:
        code, lines, figures = check(capsys, "--config", str(config))
        assert made.stock() and made.driver.made == 0  # type: ignore[attr-defined]
    assert lines[0] == "triton: disabled by config (triton = false)"
    assert code == 0
    assert not figures["would_install"] and figures["scratch_bytes"] == 0
    assert figures["reason"].startswith("disabled by config (plugins.l2evict.triton = false)")


def test_a_proven_seam_on_a_served_device_shows_the_scratch_against_stock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with triton_imported() as made:
        code, lines, figures = check(capsys)
        assert made.stock()  # check installs nothing
    assert (
        lines[0] == "triton: 3.6.0; judged table: installs; do_bench's flush would read the weights"
    )
    assert detail(lines) == (
        f"then zero a scratch of {SCRATCH:,} bytes per call (stock: 268,435,456), if the "
        "server imports triton before the hook"
    )
    assert code == 0
    assert figures == {
        "version": "3.6.0",
        "judged": "installs",
        "would_install": True,
        "reason": None,
        "scratch_bytes": SCRATCH,
    }


def test_off_cuda_without_a_driver_the_table_alone_judges(
    capsys: pytest.CaptureFixture[str], no_driver: TritonModulesStandIn
) -> None:
    _, lines, figures = check(capsys)
    assert lines[0] == f"triton: 3.6.0; judged table: installs; {STOCK}"
    assert detail(lines) == (
        f"cpu is not a CUDA device (judged by the table only): on a CUDA device, {SERVES}; {STOCK}"
    )
    assert figures["judged"] == "installs" and not figures["would_install"]
    assert figures["scratch_bytes"] == 0


def test_off_cuda_with_a_driver_the_proof_judges_and_the_flush_stays_stock_here(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with triton_imported(cpu_served=False):
        _, lines, figures = check(capsys)
    assert detail(lines).startswith("cpu is not a CUDA device (the seam proof ran): ")
    assert not figures["would_install"]


def test_another_program_s_method_on_the_driver_is_named_and_stays_stock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    driver = CudaDriverStandIn()

    def theirs() -> None:
        pass

    driver.clear_cache = theirs  # type: ignore[assignment,method-assign]
    with triton_imported(driver):
        _, lines, figures = check(capsys)
    assert lines[0] == f"triton: 3.6.0; judged table: installs; {STOCK}"
    assert "already carries its own clear_cache" in detail(lines)
    assert "another program's" in figures["reason"] and not figures["would_install"]


def test_a_triton_that_fails_to_import_is_one_line_and_leaves_b12x_s_verdict(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("triton is installed here")
    baseline = main(["check", "--device", "cpu"])
    capsys.readouterr()
    # A half-installed Triton: the package loads, its submodules do not.
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    code, lines, figures = check(capsys)
    assert lines[0] == f"triton: version unknown; not in the judged table; {STOCK}"
    assert detail(lines).startswith("importing triton raised ModuleNotFoundError")
    assert code == baseline
    assert figures["version"] is None and figures["judged"] is None
