"""The judged Triton releases: a Triton's row in ``tools/triton_releases.json``, or None.

``scripts/triton_releases.py`` writes the table, one row per ``triton`` release on the
registry from 3.0.0 on, each the seam proof's verdict on that release's source files. A
Triton with no row (a newer release, a source build) is judged by :func:`.proof.prove_triton`
where it runs. Import-free and torch-free.
"""

from __future__ import annotations

from pathlib import Path

from .._judged import Judged, judged_row

TABLE = Path(__file__).resolve().parents[1] / "tools" / "triton_releases.json"


def judged(version: str) -> Judged | None:
    """The row of ``triton==version`` (as ``triton.__version__`` spells it); None where the
    table has none. Raises :class:`~flare_l2evict.L2EvictError` where the shipped table is
    unreadable (one line: reinstall)."""
    return judged_row(TABLE, f"triton=={version}")
