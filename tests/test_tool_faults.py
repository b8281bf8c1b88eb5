"""Faults the tools meet in their environment: one line naming cause and fix, never a traceback.

Issue 28 (items 6 and 7), the tool side: ``check`` with cuda-bindings that
answer in another shape, a b12x seam module replaced by a non-module, a
truncated shipped release table and a persisting-L2 limit outside physical
range; ``startup`` with an mmap of the checkpoint that fails with
``MemoryError``; ``scripts/b12x_releases.py`` with a table that is not JSON,
rows without a reason, and versions that do not parse.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import resource
import subprocess
import sys
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from support.fake_b12x import wheel_without_b12x
from support.scripts import script
from support.stderr import the_error

from flare_l2evict.tools import _origin as _releases, _persisting_l2, main
from flare_l2evict.tools._origin import stock_row

ROOT = Path(__file__).resolve().parents[1]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- check ------------------------------------------------------------------------------


def test_a_seam_module_replaced_by_a_non_module_is_one_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    importlib.import_module(stock_row().module_path)  # the real module first, then replaced
    monkeypatch.setitem(sys.modules, stock_row().module_path, 42)
    code, out, err = run(capsys, "check", "--device", "cpu")
    assert "Traceback" not in out + err
    assert all(len(line) <= 100 for line in out.splitlines())
    # The seam proof decides as start-up's does: FlashInfer's b12x is also loaded under its
    # own root, where the real module is still found; either way the verdict and the exit
    # code say the same thing, and a fall-back names its reason and fix.
    (seam,) = [line for line in out.splitlines() if line.startswith("seam: ")]
    if code == 1:
        verdict = out[out.index("seam: falls back") :]
        assert "fix: " in verdict
    else:
        assert code == 0 and seam.startswith("seam: installs"), out


class _BindingsStandIn(types.ModuleType):
    """Stands in for cuda-bindings' runtime (no CUDA here): a release whose calls answer in
    another shape than (error, value)."""

    def __init__(self, answer: Any) -> None:
        super().__init__("cuda.bindings.runtime")
        success = object()
        self.cudaError_t = types.SimpleNamespace(cudaSuccess=success)
        self.cudaLimit = types.SimpleNamespace(cudaLimitPersistingL2CacheSize=6)
        self.cudaSetDevice = lambda index: (success,)
        self.cudaDeviceGetLimit = lambda limit: answer


@pytest.mark.parametrize("answer", [(0, 1, 2), 11_796_480, ("one",), None])
def test_cuda_bindings_in_another_shape_are_a_reader_that_does_not_work(
    monkeypatch: pytest.MonkeyPatch, answer: Any
) -> None:
    bindings = ModuleType("cuda.bindings")
    bindings.runtime = _BindingsStandIn(answer)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", bindings.runtime)
    with pytest.raises(RuntimeError, match=r"cuda-bindings answered .*not \(error, value\)"):
        _persisting_l2._via_cuda_bindings(0)


@pytest.mark.parametrize("nbytes", [-1, 1 << 50])
def test_a_limit_outside_physical_range_is_refused_as_a_device_fault(
    monkeypatch: pytest.MonkeyPatch, nbytes: int
) -> None:
    """The reader stands in (no CUDA here); the range check and the words are the real ones."""
    monkeypatch.setattr(
        _persisting_l2, "persisting_l2_bytes", lambda device: (nbytes, "cuda-bindings")
    )
    line, figures = _persisting_l2.persisting_l2_line(torch.device("cuda:0"), 60 * (1 << 20))
    assert figures.bytes is None and str(nbytes) in (figures.fault or "")
    assert f"{nbytes:,} bytes" not in line and "-1 bytes" not in line
    assert "device or driver fault" in line and "; fix: " in line


def test_a_set_aside_is_information_never_a_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _persisting_l2, "persisting_l2_bytes", lambda device: (11_796_480, "cuda-bindings")
    )
    line, figures = _persisting_l2.persisting_l2_line(torch.device("cuda:0"), 60 * (1 << 20))
    assert figures.bytes == 11_796_480
    assert "information, not a fault" in line and "warm" not in line and "fix:" not in line
    assert "survive stock's eviction and the plugin's read alike" in line
    assert "act only if the server marks lines persisting and wants its races cold" in line


def test_a_truncated_shipped_release_table_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    truncated = tmp_path / "b12x_releases.json"
    truncated.write_bytes(_releases.TABLE.read_bytes()[:1000])
    monkeypatch.setattr(_releases, "TABLE", truncated)
    code, _, err = run(capsys, "check", "--device", "cpu")
    assert code == 2 and "Traceback" not in err
    (line,) = err.splitlines()
    assert "the judged table shipped with flare-l2evict" in line
    assert line.endswith("fix: reinstall flare-l2evict")


# --- startup -----------------------------------------------------------------------------


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_an_mmap_refused_for_memory_is_one_line(tmp_path: Path) -> None:
    """A real refusal: a 64 GiB sparse checkpoint under an 12 GB address-space limit.

    The machine is said to have 1 TiB available, so the refusal of what it cannot
    hold (tests/test_machine_memory.py) lets the load reach the mmap.
    """
    from flare_l2evict.tools.reference_host._example import write_headers

    big = write_headers(tmp_path / "big.safetensors", [("w", "F32", (16 << 10, 1 << 20))])
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable:   {1 << 30} kB\n")
    limit = 12 << 30

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    cli = (
        "import sys; from pathlib import Path; from flare_l2evict.tools import _machine_memory; "
        "_machine_memory.MEMINFO = Path(sys.argv[1]); "
        "from flare_l2evict.tools.cli import main; raise SystemExit(main(sys.argv[2:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", cli, str(meminfo), "startup", str(big)],
        capture_output=True,
        text=True,
        preexec_fn=cap,  # the limit must hold in the child only
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    line = the_error(done.stderr)
    assert "cannot map its 68,719,476,864 bytes into memory" in line
    assert "fix: raise the address-space limit (ulimit -v)" in line


# --- scripts/b12x_releases.py ------------------------------------------------------------


releases = script("b12x_releases")
GOOD = {"b12x==1.5.1": {"installs": True, "reason": "0 extra bindings"}}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"b12x==1.5.1": {"installs": tr', "not a readable JSON release table"),
        ("[1, 2]", "a JSON list, not an object of rows"),
        (json.dumps({"b12x==1.5.1": {"installs": True}}), "row 'b12x==1.5.1' has no 'reason'"),
        (json.dumps({"b12x==banana": GOOD["b12x==1.5.1"]}), "'banana' is not a version"),
        (json.dumps({"torch==2.4": GOOD["b12x==1.5.1"]}), "not NAME==VERSION"),
        (json.dumps({"b12x==1.5.1": {"installs": "yes", "reason": "x"}}), "no true/false"),
    ],
)
@pytest.mark.parametrize("mode", ["--readme", "--discover", "--check"])
def test_a_bad_release_table_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str, mode: str
) -> None:
    table = tmp_path / "table.json"
    table.write_text(text)
    code = releases.main([mode, "--table", str(table)], list_versions=lambda name: [])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("error: scripts/b12x_releases.py: ") and said in line
    assert "; fix: " in line


def test_a_judge_argument_that_does_not_parse_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "table.json"
    table.write_text(json.dumps(GOOD))
    cache = tmp_path / "cache"
    code = releases.main(["--judge", "b12x==1.x.y", "--table", str(table), "--cache", str(cache)])
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2 and "'1.x.y' is not a version" in line
    # Issue 41: the cache was made before the names were checked, a folder left in the temp dir.
    assert not cache.exists()


def test_ctrl_c_is_one_line_and_exit_130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "table.json"
    table.write_text(json.dumps(GOOD))

    def interrupted(name: str) -> list[str]:
        raise KeyboardInterrupt

    code = releases.main(["--discover", "--table", str(table)], list_versions=interrupted)
    out, err = capsys.readouterr()
    assert code == 130 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("error: scripts/b12x_releases.py: interrupted; the table is unchanged")
    assert json.loads(table.read_text()) == GOOD


def test_help_says_what_it_downloads_and_where(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        releases.main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "about 800 MB for the whole table" in said
    assert f"by default the cache is {releases.CACHE}" in said


def test_a_run_that_compares_nothing_never_says_judged_as_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flipped row, judged without --check: the run says it compared nothing, and progress."""
    cache = wheel_without_b12x(tmp_path / "wheels").parent
    table = tmp_path / "table.json"
    flipped = {"flashinfer-python==0.7.9": {"installs": True, "reason": "flipped"}}
    table.write_text(json.dumps(flipped))
    common = ["--table", str(table), "--cache", str(cache)]
    assert releases.main(common) == 0
    out, err = capsys.readouterr()
    assert "judged as recorded" not in out
    assert "1 releases judged, not compared with the table (--check compares them)" in out
    assert "judging flashinfer-python==0.7.9 (1/1) ..." in err
    assert "wheel flashinfer_python-0.7.9-py3-none-any.whl: in the cache (0.0 MB)" in err
    assert releases.main([*common, "--check"]) == 1  # compared: the flipped row is caught
    assert "verdicts differ or failed for flashinfer-python==0.7.9" in capsys.readouterr().err
