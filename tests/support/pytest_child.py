"""A test run of its own, in a fresh interpreter, set up by this checkout's conftest.py.

For the tests of the run's set-up itself (its temporary directory): the child's system temp
dir is one the caller can look into, and the child is its own process group, as a shell's
foreground job is, so that a signal to the group reaches it and whatever it started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

from support import run_temp

CHECKOUT = Path(__file__).resolve().parents[2]


def start(
    where: Path,
    tests: str,
    test: str,
    system_tmp: Path,
    stdout: IO[str],
    stderr: IO[str],
    *,
    keep: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Run pytest on ``test`` of ``tests`` (a test module's text, written under ``where``),
    with ``system_tmp`` as its system temp dir, its output in ``stdout`` and ``stderr``, and
    ``env`` added to its environment. The
    checkout's conftest.py is loaded as a plugin (``-p conftest``), so the run is set up as the
    suite's own is; ``keep`` asks it to keep its directory if it does not pass."""
    (where / "pytest.ini").write_text("[pytest]\n")  # the child's rootdir: not the checkout's
    (where / "test_child.py").write_text(tests)
    environ = {
        name: value
        for name, value in os.environ.items()
        # This run's own set-up marks its children as held by its directory: not this one.
        if name not in ("FLARE_L2EVICT_TEST_TMP", run_temp.KEEP)
    }
    environ["TMPDIR"] = str(system_tmp)
    environ["PYTHONPATH"] = os.pathsep.join(
        [str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    if keep:
        environ[run_temp.KEEP] = "1"
    environ.update(env or {})
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"test_child.py::{test}",
        ],
        cwd=where,
        env=environ,
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )
