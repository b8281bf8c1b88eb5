"""A test run leaves nothing in the system temp dir, however it ends (conftest.py,
``support/run_temp.py``): passed, failed, interrupted by Ctrl-C or killed outright, sparse
checkpoints and files a child process holds open included. A run that does not pass keeps its
directory only when ``FLARE_L2EVICT_KEEP_TMP=1`` asks, and then names it.

Each test runs a child test run set up by the real conftest.py, on a module of its own, with a
system temp dir of its own to look into afterwards.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from support import pytest_child, run_temp

_DOCS = Path(__file__).resolve().parents[1] / "docs" / "installing.md"

_TESTS = """
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _write(tmp_path):
    # A checkpoint as the suite's are: sparse, a terabyte apparent.
    with open(tmp_path / "model.safetensors", "wb") as sparse:
        sparse.truncate(1 << 40)
    # And a file from the code under test, in what it takes for the system temp dir.
    Path(tempfile.gettempdir(), "from-the-code-under-test").write_text("written")


def test_passes(tmp_path):
    _write(tmp_path)


def test_fails(tmp_path):
    _write(tmp_path)
    raise AssertionError("fails on purpose")


def test_waits_to_be_stopped(tmp_path, interruptible):
    _write(tmp_path)
    held = Path(tempfile.gettempdir(), "held-open-by-a-child")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'w'); "
         "print(flush=True); time.sleep(120)", str(held)],
        stdout=subprocess.PIPE,
    )
    holder.stdout.readline()  # the file is open
    Path(os.environ["CHILD_READY"]).write_text("")
    time.sleep(120)
"""


def _run(
    tmp_path: Path, test: str, *, stop: signal.Signals | None = None, keep: bool = False
) -> tuple[int, str, str, Path]:
    """Run one of the child's tests; with ``stop``, send that signal to the child's process
    group (as a terminal's Ctrl-C does) once the test is running. Return the child's exit
    code, its stdout, and its system temp dir."""
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    ready = tmp_path / "ready"
    child = pytest_child.start(
        tmp_path, _TESTS, test, system_tmp, keep=keep, env={"CHILD_READY": str(ready)}
    )
    try:
        if stop is not None:
            deadline = time.monotonic() + 120
            while not ready.exists():
                assert child.poll() is None, child.communicate()
                assert time.monotonic() < deadline, "the child's test never started"
                time.sleep(0.05)
            os.killpg(child.pid, stop)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return child.returncode, out, err, system_tmp


def _left(system_tmp: Path, *, within: float = 0.0) -> list[str]:
    """What is left in the child's system temp dir, waiting up to ``within`` seconds for it to
    go (the watcher cleans after a killed run on its own time)."""
    deadline = time.monotonic() + within
    while True:
        left = sorted(entry.name for entry in system_tmp.iterdir())
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


@pytest.mark.slow  # each starts a fresh interpreter that imports torch (2 s)
@pytest.mark.parametrize(
    ("test", "stop", "code"),
    [
        ("test_passes", None, 0),
        ("test_fails", None, 1),
        ("test_waits_to_be_stopped", signal.SIGINT, 2),
        ("test_waits_to_be_stopped", signal.SIGTERM, -signal.SIGTERM),
        ("test_waits_to_be_stopped", signal.SIGKILL, -signal.SIGKILL),
    ],
    ids=["passed", "failed", "ctrl-c", "sigterm", "sigkill"],
)
def test_a_run_leaves_nothing_in_the_system_temp_dir(
    tmp_path: Path, test: str, stop: signal.Signals | None, code: int
) -> None:
    returncode, out, err, system_tmp = _run(tmp_path, test, stop=stop)
    assert returncode == code, out + err
    assert _left(system_tmp, within=30) == [], out + err
    assert "kept in" not in out + err


@pytest.mark.slow  # each starts a fresh interpreter that imports torch (2 s)
@pytest.mark.parametrize(
    ("test", "stop", "code"),
    [
        ("test_fails", None, 1),
        ("test_waits_to_be_stopped", signal.SIGINT, 2),
        ("test_waits_to_be_stopped", signal.SIGKILL, -signal.SIGKILL),
    ],
    ids=["failed", "ctrl-c", "sigkill"],
)
def test_a_run_that_does_not_pass_keeps_its_directory_on_request_and_names_it(
    tmp_path: Path, test: str, stop: signal.Signals | None, code: int
) -> None:
    returncode, out, err, system_tmp = _run(tmp_path, test, stop=stop, keep=True)
    assert returncode == code, out + err
    (kept,) = _left(system_tmp)
    assert kept.startswith("flare-l2evict-tests-"), kept
    line = run_temp.kept_line(str(system_tmp / kept))
    # The run's last line; a killed run's is the watcher's, on the run's stderr.
    said = err if stop == signal.SIGKILL else out
    assert said.rstrip("\n").rsplit("\n", 1)[-1] == line, out + err
    assert (system_tmp / kept / "from-the-code-under-test").read_text() == "written"
    assert list((system_tmp / kept / "pytest").rglob("model.safetensors")), out + err


@pytest.mark.slow  # a fresh interpreter that imports torch (2 s)
def test_a_passed_run_removes_its_directory_even_on_request(tmp_path: Path) -> None:
    returncode, out, err, system_tmp = _run(tmp_path, "test_passes", keep=True)
    assert returncode == 0, out + err
    assert _left(system_tmp) == [], out + err


def test_the_line_naming_a_kept_directory_is_the_one_the_docs_show() -> None:
    shown = " ".join(_DOCS.read_text(encoding="utf-8").split())
    assert f"`{run_temp.kept_line('DIR')}`" in shown
