"""``scripts/gpu_suite.sh`` refuses a machine with no CUDA device, and names the b12x provider."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_suite.sh"


@pytest.mark.slow  # the suite's shell script and the interpreters it starts
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_no_cuda_device_is_one_line_and_exit_2_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    bin_dir = Path(sys.executable).parent  # this venv's python3 first, as on a GPU machine
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "OUT": str(out), "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: scripts/gpu_suite.sh: no CUDA device here")
    assert line.endswith("fix: run it on the GPU machine")
    assert not out.exists()  # nothing ran: not even its output directory was made


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_the_header_names_the_provider_when_flashinfer_ships_b12x() -> None:
    """The venv's b12x is flashinfer-python's: no ``b12x`` distribution, and no traceback."""
    import b12x

    if "/flashinfer/" not in (b12x.__file__ or ""):
        pytest.skip("this environment's b12x is not flashinfer-python's")
    text = SCRIPT.read_text()
    snippet = re.search(r"<<'PY'.*?\n(.*?)\nPY\n", text, re.S)
    assert snippet is not None
    done = subprocess.run(
        [sys.executable, "-c", snippet.group(1)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    from importlib.metadata import version

    assert done.stdout.startswith(f"torch {torch.__version__} | b12x provider: flashinfer-python ")
    assert version("flashinfer-python") in done.stdout
