"""A test run leaves nothing in the system temp dir, however it ends (conftest.py,
``support/run_temp.py``): passed, failed, interrupted by Ctrl-C or killed outright, sparse
checkpoints and files a child process holds open included. A run that does not pass keeps its
directory only when ``FLARE_L2EVICT_KEEP_TMP=1`` asks, and then names it.

Each test runs a child test run set up by the real conftest.py, on a module of its own, with a
system temp dir of its own to look into afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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


def test_forks_a_process_that_outlives_it(tmp_path):
    _write(tmp_path)
    if os.fork() == 0:  # holds what the run's process held, its ends of pipes included
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        time.sleep(120)
        os._exit(0)


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


@dataclasses.dataclass
class _Ended:
    """A child run that has ended, and where to look."""

    code: int
    system_tmp: Path
    stdout: Path
    stderr: Path

    def said(self) -> str:
        """Its stdout and stderr, for a failing assertion's message."""
        return self.stdout.read_text() + self.stderr.read_text()


def _run(
    tmp_path: Path, test: str, *, stop: signal.Signals | None = None, keep: bool = False
) -> _Ended:
    """Run one of the child's tests; with ``stop``, send that signal to the child's process
    group (as a terminal's Ctrl-C does) once the test is running.

    Its output goes to files, not pipes: a process that outlives the run may hold them open.
    """
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    ready = tmp_path / "ready"
    ended = _Ended(0, system_tmp, tmp_path / "stdout", tmp_path / "stderr")
    with ended.stdout.open("w") as stdout, ended.stderr.open("w") as stderr:
        child = pytest_child.start(
            tmp_path,
            _TESTS,
            test,
            system_tmp,
            stdout,
            stderr,
            keep=keep,
            env={"CHILD_READY": str(ready)},
        )
    try:
        if stop is not None:
            deadline = time.monotonic() + 120
            while not ready.exists():
                assert child.poll() is None, ended.said()
                assert time.monotonic() < deadline, "the child's test never started"
                time.sleep(0.05)
            os.killpg(child.pid, stop)
        ended.code = child.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group, whatever outlived the run
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    return ended


def _soon(check: Callable[[], bool], within: float = 30) -> bool:
    """Whether ``check`` holds within ``within`` seconds: the watcher cleans after a killed
    run on its own time."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _left(system_tmp: Path) -> list[str]:
    return sorted(entry.name for entry in system_tmp.iterdir())


def _last_line(path: Path) -> str:
    return path.read_text().rstrip("\n").rsplit("\n", 1)[-1]


@pytest.mark.slow  # each starts a fresh interpreter that imports torch (2 s)
@pytest.mark.parametrize(
    ("test", "stop", "code"),
    [
        ("test_passes", None, 0),
        ("test_fails", None, 1),
        ("test_forks_a_process_that_outlives_it", None, 0),
        ("test_waits_to_be_stopped", signal.SIGINT, 2),
        ("test_waits_to_be_stopped", signal.SIGTERM, -signal.SIGTERM),
        ("test_waits_to_be_stopped", signal.SIGKILL, -signal.SIGKILL),
    ],
    ids=["passed", "failed", "forked-child-outlives-it", "ctrl-c", "sigterm", "sigkill"],
)
def test_a_run_leaves_nothing_in_the_system_temp_dir(
    tmp_path: Path, test: str, stop: signal.Signals | None, code: int
) -> None:
    ended = _run(tmp_path, test, stop=stop)
    assert ended.code == code, ended.said()
    assert _soon(lambda: _left(ended.system_tmp) == []), (_left(ended.system_tmp), ended.said())
    assert "kept in" not in ended.said()


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
    ended = _run(tmp_path, test, stop=stop, keep=True)
    assert ended.code == code, ended.said()
    # The run's last line; a killed run's comes from the watcher, on the run's stderr.
    said = ended.stderr if stop == signal.SIGKILL else ended.stdout
    assert _soon(lambda: "kept in" in _last_line(said)), ended.said()
    (kept,) = _left(ended.system_tmp)
    assert kept.startswith("flare-l2evict-tests-"), kept
    assert _last_line(said) == run_temp.kept_line(str(ended.system_tmp / kept)), ended.said()
    assert (ended.system_tmp / kept / "from-the-code-under-test").read_text() == "written"
    assert list((ended.system_tmp / kept / "pytest").rglob("model.safetensors")), ended.said()


@pytest.mark.slow  # a fresh interpreter that imports torch (2 s)
def test_a_passed_run_removes_its_directory_even_on_request(tmp_path: Path) -> None:
    ended = _run(tmp_path, "test_passes", keep=True)
    assert ended.code == 0, ended.said()
    assert _left(ended.system_tmp) == [], ended.said()


def test_the_line_naming_a_kept_directory_is_the_one_the_docs_show() -> None:
    shown = " ".join(_DOCS.read_text(encoding="utf-8").split())
    assert f"`{run_temp.kept_line('DIR')}`" in shown


_FORK_SERVER = """
import multiprocessing
import sys

sys.path.insert(0, sys.argv[1])
from support import run_temp

if __name__ == "__main__":
    print(run_temp.multiprocessing_temp_dir())
    rank = multiprocessing.get_context("forkserver").Process(target=print, args=("rank",))
    rank.start()
    rank.join()
    sys.exit(rank.exitcode)
"""


@pytest.mark.slow  # a fresh interpreter and its fork server (0.5 s)
def test_the_fork_servers_socket_fits_under_a_long_tmpdir(tmp_path: Path) -> None:
    # Without the short directory: "OSError: AF_UNIX path too long" in every gloo test.
    long = tmp_path / ("d" * 100) / ("d" * 100)
    long.mkdir(parents=True)
    ran = subprocess.run(
        [sys.executable, "-c", _FORK_SERVER, str(Path(__file__).parent)],
        env={**os.environ, "TMPDIR": str(long)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    made, said = ran.stdout.splitlines()
    assert said == "rank" and not made.startswith(str(long)), made
    assert list(long.iterdir()) == []
