"""The built wheel is the plugin and the operator's tools: the bench stays in the checkout.

The wheel is built from a copy of the checkout, so the build's ``build/`` and
``*.egg-info`` never land beside the source tree that the other tests import
(an egg-info there would be a second distribution, with a second entry point).
No index is asked: setuptools is the venv's, and the build is not isolated.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pip builds the wheel

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench"
# What a build never reads, and the checkout's own outputs; everything else is copied.
_NOT_SOURCE = {".git", ".ci", ".venv", ".whl", "build", "dist", "example", "bench-out", "results"}


def _ignored(_directory: str, names: list[str]) -> set[str]:
    return {
        n
        for n in names
        if n in _NOT_SOURCE or n.endswith((".egg-info", "_cache")) or n == "__pycache__"
    }


def _built_wheel(tmp_path: Path) -> list[str]:
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=_ignored)
    out = tmp_path / "wheel"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--wheel-dir", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = out.glob("flare_l2evict-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_built_wheel_holds_no_bench_module(tmp_path: Path) -> None:
    names = _built_wheel(tmp_path)
    # Not empty by accident: every module of the package (the plugin, its tools) is there.
    package = sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "flare_l2evict").rglob("*.py")
        if "__pycache__" not in p.parts
    )
    assert "flare_l2evict/plugin.py" in package and "flare_l2evict/tools/cli/__init__.py" in package
    assert not [n for n in package if n not in names]
    modules = [n for n in names if n.endswith(".py")]
    assert not [n for n in names if "/bench/" in n or n.startswith(("bench/", "benchmarks/"))]
    bench_modules = {p.stem for p in BENCH.glob("*.py")} - {"__init__", "__main__"}
    assert "_coldness" in bench_modules and "_triton_gemm" in bench_modules
    found = [n for n in modules if Path(n).stem in bench_modules]
    assert not found, f"bench modules in the wheel: {found}"
