"""The judged table of b12x releases, as ``check`` looks a provider up in it; torch-free.

``b12x_releases.json`` (next to this module) holds one row per published
release of ``b12x`` and ``flashinfer-python``, written by
``scripts/b12x_releases.py --judge NAME==VERSION --write``; CI fails when the
registry has a release without a row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("b12x_releases.json")


@dataclass(frozen=True)
class Judged:
    """One row: whether the plugin installs on that release, and its one-line reason."""

    installs: bool
    reason: str


def judged(distribution: str, version: str) -> Judged | None:
    """The row of ``distribution==version``; None where the table has none."""
    row = json.loads(TABLE.read_text()).get(f"{distribution}=={version}")
    if not isinstance(row, dict):
        return None
    return Judged(bool(row.get("installs")), str(row.get("reason", "")))
