"""A command line run in a fresh interpreter, with one real SIGINT at a chosen moment after its
spawn: what it printed, how it ended, and whether its ``main`` had taken Ctrl-C by then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Ended:
    """How one interrupted (or not) run ended."""

    at: float
    """Seconds after the spawn the SIGINT was sent (``inf``: none was)."""
    code: int
    """Its exit status (``-2``: the process was ended by SIGINT itself)."""
    out: str
    err: str
    seconds: float
    """From its spawn to its exit."""
    held: bool
    """Whether the command's runner held the signals when the SIGINT was sent (see
    :func:`runner_holds`); before it, the interpreter's own start-up runs."""


def runner_holds(pid: int) -> bool:
    """Whether process ``pid`` has reached the command's runner: SIGTERM is caught or ignored.

    The runner changes SIGTERM's disposition first thing (:func:`flare_l2evict.tools._signals.
    of_a_command`); before it, the interpreter starts and imports the few modules of the
    console script's ``import``, and nothing of the package has run. A process that is gone
    (or a zombie, whose dispositions read 0) counts as reached: its output decides.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    if fields.get("State", "").startswith("Z"):
        return True
    term = 1 << (signal.SIGTERM - 1)
    return any(int(fields.get(key, "0"), 16) & term for key in ("SigCgt", "SigIgn"))


def run_interrupted(
    argv: list[str], at: float, env: dict[str, str], cwd: Path, timeout: float = 120
) -> Ended:
    """``python -m flare_l2evict ARGV`` in ``cwd``, sent SIGINT ``at`` seconds after its spawn."""
    began = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, "-m", "flare_l2evict", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    ) as child:
        held = True
        if at != float("inf"):
            time.sleep(max(0.0, at - (time.perf_counter() - began)))
            held = runner_holds(child.pid)
            child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=timeout)
    return Ended(at, child.returncode, out, err, time.perf_counter() - began, held)


ROOT = Path(__file__).resolve().parents[2]


def child_env(tmp: Path) -> dict[str, str]:
    """This environment, with this checkout's package first and the child's temporary files
    under ``tmp`` (checked after)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp)}
