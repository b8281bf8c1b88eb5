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

from .._errors import L2EvictError
from .._text import shown

TABLE = Path(__file__).with_name("b12x_releases.json")


@dataclass(frozen=True)
class Judged:
    """One row: whether the plugin installs on that release, and its one-line reason."""

    installs: bool
    reason: str


def judged(distribution: str, version: str) -> Judged | None:
    """The row of ``distribution==version``; None where the table has none.

    Raises :class:`~flare_l2evict.L2EvictError` (one line: the file, what is
    wrong, reinstall) where the shipped table is unreadable or not a JSON object.
    """
    try:
        table = json.loads(TABLE.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise L2EvictError(
            f"the judged table shipped with flare-l2evict ({shown(str(TABLE))}) is unreadable "
            f"({type(error).__name__}: {shown(str(error), 120)}; truncated?); "
            "fix: reinstall flare-l2evict"
        ) from None
    if not isinstance(table, dict):
        raise L2EvictError(
            f"the judged table shipped with flare-l2evict ({shown(str(TABLE))}) is a JSON "
            f"{type(table).__name__}, not an object of rows; fix: reinstall flare-l2evict"
        )
    row = table.get(f"{distribution}=={version}")
    if not isinstance(row, dict):
        return None
    return Judged(bool(row.get("installs")), str(row.get("reason", "")))
