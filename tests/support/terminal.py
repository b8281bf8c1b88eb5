"""A line on the terminal from inside a set-up, past pytest's capture."""

from __future__ import annotations

import contextlib

import pytest


def say(config: pytest.Config, line: str) -> None:
    """Write ``line`` to the terminal now, even under ``-q`` and pytest's output capture.

    For a set-up that spawns processes and takes seconds: whoever watches the run sees what
    it waits on. Nothing is written where the terminal reporter is off (``-p no:terminal``).
    """
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is None:
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    # The capture holds the terminal's file descriptor during a set-up; lift it for the line.
    lifted = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with lifted:
        reporter.write_line(line)
