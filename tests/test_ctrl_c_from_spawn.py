"""Ctrl-C at any moment of a command's life: one line and exit 130 with nothing left behind, or
the complete output and the exit code it states (issue 46).

Each command is run in fresh interpreters, each sent one real SIGINT at its own moment, from
its spawn to past its exit. Before the command's runner takes Ctrl-C (``main``'s first line,
a few milliseconds of light imports after the interpreter starts) the interpreter's own
start-up runs: a SIGINT there ends the process as CPython ends it, before any line of the
package has run and before it could write anything. The test tells those moments apart by
the child's signal dispositions (:func:`support.interrupts.runner_holds`), and holds every
other moment to the promise.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.interrupts import Ended, child_env, run_interrupted

MOMENTS = 20
"""SIGINTs per command, spread evenly from its spawn to 1.25 times its uninterrupted run
(the machine may be slower by then than for that run)."""
COMMANDS = {
    # argv; whether stdout may hold the lines printed before the interruption (check prints
    # each step as it goes; its verdict line, the result, comes only once it is settled).
    "startup": (["startup", "-q"], False),
    "check": (["check", "-q"], True),
    "example": (["example", "-q", "--out", "out/example"], False),  # the same words each run
}


@pytest.fixture
def signals_as_a_shell_gives_them() -> Iterator[None]:
    """The children start with Ctrl-C and SIGTERM at their defaults, as a shell's foreground
    job has them, whatever this run inherited (a disposition this process handles is reset
    to the default in a child; one it ignores would stay ignored)."""
    inherited = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        for number, handler in inherited.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def _run(name: str, at: float, where: Path) -> tuple[Ended, Path]:
    argv, _ = COMMANDS[name]
    tmp = where / "tmp"
    tmp.mkdir(parents=True)
    return run_interrupted(argv, at, child_env(tmp), cwd=where), where


def _written(where: Path) -> list[str]:
    out = where / "out"
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []


def _judge(name: str, ended: Ended, where: Path, reference: Ended, files: list[str]) -> str:
    """What the run ended as; raises if it broke the promise."""
    _, progress = COMMANDS[name]
    shown = f"{name} at {ended.at:.3f} s: code {ended.code}, out {ended.out[-300:]!r}, " \
            f"err {ended.err[-600:]!r}"  # fmt: skip
    left = sorted(p.name for p in (where / "tmp").iterdir())
    written = _written(where)
    if ended.out == reference.out and ended.code == reference.code and ended.err == "":
        assert left == [] and written == files, f"{shown}: left {left}, wrote {written}"
        return "complete"
    assert left == [] and written == [], f"{shown}: left {left} and wrote {written}"
    if not ended.held:  # the interpreter's own start-up: none of the package had run
        assert ended.out == "", shown
        return "before the runner"
    lines = ended.err.splitlines()
    assert ended.code == 130 and len(lines) == 1, shown
    assert lines[0].startswith(f"error: flare-l2evict {name}: interrupted") or lines[0].startswith(
        "error: flare-l2evict: interrupted"
    ), shown
    if progress:
        assert reference.out.startswith(ended.out) and "verdict:" not in ended.out, shown
    else:
        assert ended.out == "", shown
    return "interrupted"


PARTS = 2
"""Each command's moments are taken in this many interleaved parts, a test each (moment k in
part k % PARTS): every part spans the command's whole life, and none runs for long."""


@pytest.mark.slow  # 2 + 10 fresh interpreters, 2 at a time: 12 to 20 s on two shared cores
@pytest.mark.usefixtures("signals_as_a_shell_gives_them")
@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize("name", list(COMMANDS))
def test_ctrl_c_at_any_moment_ends_in_one_line_and_130_or_in_the_complete_output(
    name: str, part: int, tmp_path: Path
) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        # The command's uninterrupted run: its output, code and length; the second of two, so
        # that a cold first import (files not yet cached) does not stretch the moments.
        _run(name, float("inf"), tmp_path / "warm")
        reference, where = _run(name, float("inf"), tmp_path / "reference")
        assert reference.code in (0, 1) and reference.err == "", (name, reference)
        files = _written(where)
        runs = [
            pool.submit(_run, name, 1.25 * reference.seconds * k / MOMENTS, tmp_path / str(k))
            for k in range(part, MOMENTS, PARTS)
        ]
        tally: dict[str, int] = {}
        for future in runs:
            ended, where = future.result()
            seen = _judge(name, ended, where, reference, files)
            tally[seen] = tally.get(seen, 0) + 1
    print(f"\nSIGINT at {len(runs)} of {MOMENTS} moments: {name} {tally}")
    # At least a quarter of all the moments, counted per part (every part's share of it).
    assert tally.get("interrupted", 0) >= math.ceil(MOMENTS / 4 / PARTS), (name, tally)
