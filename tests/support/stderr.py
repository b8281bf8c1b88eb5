"""Reading a command's stderr: its one error line, after the steps it announced."""

from __future__ import annotations

STEP = "INFO flare-l2evict "
"""How a command's progress line begins (``-q`` silences them): one per step that can take
seconds, before the step."""


def the_error(stderr: str) -> str:
    """The one ``error: ...`` line of ``stderr`` (with its newline); every other line must be
    a step the command announced before it failed."""
    lines = stderr.splitlines(keepends=True)
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert all(line.startswith(STEP) for line in lines if line not in errors), stderr
    return errors[0]
