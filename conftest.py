"""Shared fixtures and the ``gpu`` marker (skipped without CUDA).

The tests' common host (plugin manager, CPU runtime, weights, seam, and the figures
L2/JOBS/CREDIT, each stated once) is ``tests/support/hosts.py``; reaching the process's
start-up is ``tests/support/startups.py``.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

import flare_l2evict

if TYPE_CHECKING:
    from support.run_temp import RunTemp

_SESSION_TMP = "FLARE_L2EVICT_TEST_TMP"

# pytest puts tests/ on sys.path as it imports the first test module; the run's set-up below
# needs support/ before that.
_TESTS = str(Path(__file__).resolve().parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


def _quick_cpu() -> None:
    """How this process and every process it starts use the CPU, where the caller has not said
    otherwise. Both change how fast torch gets memory and arithmetic, not what it computes: no
    figure a test checks moves.

    ``OMP_NUM_THREADS=1``: one intra-op thread. The tests' CPU kernels are memory-bound copies
    and sums, and on two cores shared with spawned ranks, fresh interpreters or a neighbour's
    run, torch's second OpenMP thread only waits for a core (the edit loop: 158 s to 102 s
    on two busy cores).

    ``THP_MEM_ALLOC_ENABLE=1``: torch's large CPU allocations in huge pages. Most tests make
    64 MiB or more of weights (stock's smallest window), and faulting them in 4 KiB pages was
    a quarter of the edit loop's time, in the kernel (the edit loop: 92 s to 78 s, back to back
    on two lightly loaded cores, the peak memory unchanged). Torch reads it at each allocation.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"  # read by every process the tests start
        torch.set_num_threads(1)  # this process's OpenMP read the variable at import already
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """One temporary directory owns everything the run writes (``support.run_temp``): pytest's
    ``tmp_path`` roots and whatever the code under test, or a process it starts, puts in the
    system temp dir.

    It is removed when the run ends, passed, failed or interrupted, and a watcher process
    removes it if the run is killed: so a run leaves nothing in the system temp dir, sparse
    checkpoints (terabytes apparent) included. ``FLARE_L2EVICT_KEEP_TMP=1`` keeps it when the
    run does not pass, and the run's last line names it.
    First, :func:`_quick_cpu`, for this process and the ones the tests start.
    """
    _quick_cpu()
    if os.environ.get(_SESSION_TMP):  # a pytest started by a test: its parent's root holds it
        return
    from support import run_temp

    made = run_temp.RunTemp(also=(run_temp.multiprocessing_temp_dir(),))
    config.stash[_ROOT] = (made, os.environ.get("TMPDIR"))
    os.environ[_SESSION_TMP] = os.environ["TMPDIR"] = made.path
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    if config.option.basetemp is None:  # a --basetemp given is the operator's to keep
        config.option.basetemp = os.path.join(made.path, "pytest")
    # The last resort in this process: an exception out of another plugin's unconfigure.
    atexit.register(_end_the_run_temp, config)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built (the modules, torch's, the tests and their parameters) is moved out
    of the garbage collector's sight: it lives to the end of the run anyway, and every full
    collection walked it again (half a million objects: 7 s of the edit loop's 70, now 3 s).
    Objects the tests make are collected as before; so are any cycles among them.
    """
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_PASSED] = exitstatus in (
        pytest.ExitCode.OK,
        pytest.ExitCode.NO_TESTS_COLLECTED,
    )


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After the terminal's summary, so that the line naming a kept directory is the last."""
    _end_the_run_temp(config)


def _end_the_run_temp(config: pytest.Config) -> None:
    found = config.stash.get(_ROOT, None)
    if found is None:
        return
    del config.stash[_ROOT]
    made, tmpdir = found
    os.environ.pop(_SESSION_TMP, None)
    if tmpdir is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = None
    # A run that never finished its session (a usage error after this set-up) wrote nothing.
    kept = made.close(passed=config.stash.get(_PASSED, True))
    if kept is not None:
        from support import run_temp

        line = run_temp.kept_line(kept)
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is None:
            print(line, file=sys.stderr)
        else:
            reporter.write_line(line)


_ROOT = pytest.StashKey[tuple["RunTemp", str | None]]()
_PASSED = pytest.StashKey[bool]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _gpu_settled_before_each_gpu_test(request: pytest.FixtureRequest) -> None:
    """Every GPU test starts from an allocator at rest: a neighbour's garbage moves no figure."""
    if "gpu" in request.keywords and torch.cuda.is_available():
        from support.gpu_memory import settled

        settled(torch.device("cuda", torch.cuda.current_device()))


@pytest.fixture(autouse=True)
def _stock_b12x_after_each_test() -> Iterator[None]:
    """No test leaks an installed eviction or a plugin start-up into the next."""
    yield
    from support.startups import end_any

    end_any()
    flare_l2evict.restore()


@pytest.fixture
def interruptible() -> Iterator[None]:
    """Ctrl-C as an interactive shell's foreground job has it (Python's own handler), whatever
    this run inherited: a run started with `&` from a script has SIGINT ignored."""
    inherited = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if inherited is None else inherited)


@pytest.fixture
def write_checkpoint(tmp_path: Path) -> Callable[[dict[str, torch.Tensor], str], Path]:
    """Write real safetensors files under the test's temporary directory."""
    from safetensors.torch import save_file

    def write(tensors: dict[str, torch.Tensor], name: str = "model.safetensors") -> Path:
        path = tmp_path / name
        save_file(tensors, str(path))
        return path

    return write
