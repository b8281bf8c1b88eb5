"""The environment of the bench's fresh interpreters: they import the bench from this checkout."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout that holds ``benchmarks/``: the bench is never installed, so a child
started from any directory finds it only through this path."""


def child_env() -> dict[str, str]:
    """This process's environment with :data:`ROOT` first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env
