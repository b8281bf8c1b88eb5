"""A judged release table shipped in the package: one row per release, read torch-free.

``tools/b12x_releases.json`` and ``tools/triton_releases.json`` are written by
``scripts/b12x_releases.py`` and ``scripts/triton_releases.py`` (``--judge NAME==VERSION
--write``); CI fails when the registry has a release without a row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ._errors import L2EvictError
from ._text import shown


@dataclass(frozen=True)
class Judged:
    """One row: whether the plugin installs on that release, and its one-line reason."""

    installs: bool
    reason: str


def judged_row(table: Path, release: str) -> Judged | None:
    """The row of ``release`` (``NAME==VERSION``) in ``table``; None where it has none.

    Raises :class:`~flare_l2evict.L2EvictError` (one line: the file, what is
    wrong, reinstall) where the shipped table is unreadable or not a JSON object.
    """
    try:
        rows = json.loads(table.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise L2EvictError(
            f"the judged table shipped with flare-l2evict ({shown(str(table))}) is unreadable "
            f"({type(error).__name__}: {shown(str(error), 120)}; truncated?); "
            "fix: reinstall flare-l2evict"
        ) from None
    if not isinstance(rows, dict):
        raise L2EvictError(
            f"the judged table shipped with flare-l2evict ({shown(str(table))}) is a JSON "
            f"{type(rows).__name__}, not an object of rows; fix: reinstall flare-l2evict"
        )
    row = rows.get(release)
    if not isinstance(row, dict):
        return None
    return Judged(bool(row.get("installs")), str(row.get("reason", "")))
