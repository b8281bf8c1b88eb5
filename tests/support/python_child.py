"""Code run in a fresh interpreter, so that a hang fails the calling test by its timeout."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str, timeout: float = 60) -> str:
    """The stdout of ``python -c code``; the caller's test fails if it exits non-zero or hangs."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
