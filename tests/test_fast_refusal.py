"""Usage and input errors are answered before torch or b12x is imported (issue 29, item 1), and
so are device errors on a machine with no GPU driver (issue 35, item 2).

Each mistake runs in a fresh interpreter that calls the CLI's ``main`` and then
reports whether ``torch`` and ``b12x`` are in ``sys.modules``: the clock varies
with the machine, the modules do not. The wall time of each refusal is printed
(``-s``) for the record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PROBE = r"""
import importlib, json, sys
main = importlib.import_module(sys.argv[1]).main
try:
    code = main(sys.argv[2:])
except SystemExit as exited:
    code = exited.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules,
                  "b12x": any(m == "b12x" or m.startswith("b12x.") for m in sys.modules)}))
"""

CASES: list[tuple[str, list[str], str]] = [
    ("misspelled --plugin", ["startup", "--plugin", "l2evic"], "no such flare plugin"),
    ("missing --config", ["startup", "--config", "{dir}/missing.toml"], "no such config file"),
    ("window = 256MBB", ["startup", "--plugin", "l2evict", "--config", "{dir}/bad.toml"],
     "window"),
    ("unknown config key", ["startup", "--plugin", "l2evict", "--config", "{dir}/unknown.toml"],
     "unknown key"),
    ("missing checkpoint (startup)", ["startup", "{dir}/missing.safetensors"],
     "no such checkpoint"),
    ("a text file as checkpoint (startup)", ["startup", "{dir}/notes.txt"], "a text file"),
    ("window = 256MBB (check)", ["check", "--config", "{dir}/bad.toml"], "window"),
    ("missing checkpoint (check)", ["check", "{dir}/missing.safetensors"], "no such"),
    ("abbreviated flag", ["startup", "--race-job", "3"], "unrecognized arguments"),
    ("schema of no JSON command", ["schema", "example"], "invalid choice: 'example'"),
    ("unknown config key (plan)", ["plan", "{dir}/missing.safetensors", "--config",
                                   "{dir}/unknown.toml"], "unknown key"),
]  # fmt: skip


def _driver_here() -> bool:
    """Whether this machine has any trace of a GPU driver (then torch must be asked)."""
    import ctypes.util

    traces = ("/dev/nvidiactl", "/proc/driver/nvidia", "/sys/module/nvidia", "/dev/dxg",
              "/dev/kfd")  # fmt: skip
    return (
        not sys.platform.startswith("linux")
        or any(map(os.path.exists, traces))
        or ctypes.util.find_library("cuda") is not None
    )


_NO_DRIVER = pytest.mark.skipif(_driver_here(), reason="this machine has a GPU driver")
_BENCH = "benchmarks.bench._command"
NO_DRIVER_CASES: list[tuple[str, list[str], str]] = [
    ("--device cuda:0 (startup)", ["startup", "--device", "cuda:0"], "no NVIDIA driver"),
    ("--device cuda:3 (check)", ["check", "--device", "cuda:3"], "no NVIDIA driver"),
    ("--races (check)", ["check", "--races"], "no NVIDIA driver"),
    ("--races --device cuda:0 (check)", ["check", "--races", "--device", "cuda:0"],
     "--races runs b12x's races"),
    ("the bench's default cuda:0", [_BENCH], "no CUDA here"),
    ("--device cuda:1 (bench)", [_BENCH, "--device", "cuda:1"], "CUDA is not available here"),
]  # fmt: skip
"""Refused on a machine with no GPU driver at all, before torch: ``torch.cuda`` costs its
import. Each runs the CLI unless it names another entry point's module first."""

_CLI = "flare_l2evict.tools.cli"
ALL_CASES = [pytest.param(*case, id=case[0]) for case in CASES] + [
    pytest.param(*case, id=case[0], marks=_NO_DRIVER) for case in NO_DRIVER_CASES
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("mistakes")
    (where / "bad.toml").write_text('[plugins.l2evict]\nwindow = "256MBB"\n')
    (where / "unknown.toml").write_text('[plugins.l2evict]\nwindw = "stock"\n')
    (where / "notes.txt").write_text("the weights are in the other directory\n")
    return where


@pytest.mark.slow  # a fresh interpreter of the command line per mistake
@pytest.mark.parametrize(("what", "argv", "said"), ALL_CASES)
def test_each_mistake_is_refused_before_torch_is_imported(
    inputs: Path, what: str, argv: list[str], said: str
) -> None:
    args = [a.format(dir=inputs) for a in argv]
    if args[0] != _BENCH:
        args.insert(0, _CLI)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    wall = time.perf_counter() - began
    print(f"\nrefused in {wall:.2f} s: {what}: {done.stderr.strip()[:160]}")
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] == 2, (what, done.stderr)
    assert not seen["torch"], f"{what}: torch was imported before the refusal"
    assert not seen["b12x"], f"{what}: b12x was imported before the refusal"
    lines = done.stderr.strip().splitlines()
    program = "python -m benchmarks.bench" if args[0] == _BENCH else "flare-l2evict"
    assert len(lines) == 1 and lines[0].startswith(f"error: {program}"), done.stderr
    assert said in lines[0] and "; fix: " in lines[0]


def test_any_trace_of_a_driver_leaves_the_answer_to_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The check refuses only where CUDA cannot work: never a false refusal on a GPU machine."""
    from flare_l2evict.tools.cli import _shared as _driver

    monkeypatch.setattr(_driver, "DRIVER_LIBRARY", "libflare-l2evict-no-such-driver.so.1")
    monkeypatch.setattr(_driver, "_GPU_PATHS", (str(tmp_path / "nvidiactl"),))
    assert _driver.missing_driver() == (
        "no NVIDIA driver: libflare-l2evict-no-such-driver.so.1 does not load and there is no "
        "/dev/nvidiactl"
    )
    (tmp_path / "nvidiactl").touch()  # a device file, the kernel module, WSL's or ROCm's
    assert _driver.missing_driver() is None
    (tmp_path / "nvidiactl").unlink()
    monkeypatch.setattr(_driver, "DRIVER_LIBRARY", "libc.so.6")  # a library that loads
    assert _driver.missing_driver() is None
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(_driver, "DRIVER_LIBRARY", "libflare-l2evict-no-such-driver.so.1")
    assert _driver.missing_driver() is None


HEAVY = ("torch", "pydantic", "pydantic_core", "numpy", "safetensors", "pluggy", "b12x", "yaml")
"""What ``--help``, ``--version`` and a usage error must not import: each costs tenths of a
second (torch seconds), and none is needed to read a command line."""

_IMPORTS = r"""
import json, sys
from flare_l2evict.tools.cli import main
for argv in (["plan", "--bogus"], ["plan", "x", "--bogus"], ["chek"], ["check", "--jsn"],
             ["--help"], ["--version"], ["startup", "--help"], ["schema", "nothing"]):
    try:
        main(argv)
    except SystemExit as exited:
        assert exited.code in (0, 2), (argv, exited.code)
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def test_help_version_and_usage_errors_import_nothing_heavy() -> None:
    # Issue 46: the registry imported every command's module up front, and check's brought
    # pydantic, the settings and the preflight: 0.42 to 0.58 s before any argument was read.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert [name for name in HEAVY if name in imported] == []
