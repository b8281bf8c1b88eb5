"""Time what ``flare-l2evict`` answers at once: a usage error, ``--help`` and ``--version``.

Each run is a fresh interpreter (``python -m flare_l2evict``, the console script's program),
pinned to two cores with ``taskset -c 0,1`` where there is ``taskset``, as docs/command-line.md
states its figure. The interpreter alone (``python -c pass``) is timed beside them: what the
package adds is the difference. Prints the median and the range of wall seconds; asserts
nothing about time.

    python -m benchmarks.cli_answer [--runs N]
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

from benchmarks.bench._child import child_env

ANSWERS = {
    "python -c pass (the interpreter alone)": ["-c", "pass"],
    "flare-l2evict plan --bogus": ["-m", "flare_l2evict", "plan", "--bogus"],
    "flare-l2evict --help": ["-m", "flare_l2evict", "--help"],
    "flare-l2evict --version": ["-m", "flare_l2evict", "--version"],
}


def _pinned() -> list[str]:
    return ["taskset", "-c", "0,1"] if shutil.which("taskset") else []


def seconds(argv: list[str], runs: int) -> list[float]:
    """Wall seconds of ``runs`` fresh interpreters running ``argv``, one after another."""
    env = child_env()
    taken = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run([*_pinned(), sys.executable, *argv], capture_output=True, env=env)
        taken.append(time.perf_counter() - began)
    return taken


def main() -> None:
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 15
    where = "pinned to cores 0,1 (taskset)" if _pinned() else "not pinned (no taskset here)"
    print(f"{where}; {runs} runs each (after one to warm the caches); wall seconds:")
    for what, argv in ANSWERS.items():
        seconds(argv, 1)
        taken = seconds(argv, runs)
        print(
            f"  {what:<40} median {statistics.median(taken):.3f} "
            f"({min(taken):.3f} to {max(taken):.3f})"
        )


if __name__ == "__main__":
    main()
