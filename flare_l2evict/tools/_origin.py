"""Where the b12x that ``import b12x`` loads comes from, its judged release row, and its seam row.

``b12x_releases.json`` (next to this module) holds one row per published release of
``b12x`` and ``flashinfer-python``, written by ``scripts/b12x_releases.py --judge
NAME==VERSION --write``; CI fails when the registry has a release without a row.
``check`` looks the provider found up in it (:func:`judged`). No runtime use; torch-free.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .._b12x.table import SeamRow, rows
from .._judged import Judged, judged_row


@dataclass(frozen=True)
class B12xOrigin:
    """The b12x that ``import b12x`` loads, and the installed distribution that ships it.

    flashinfer-python's wheel installs a top-level ``b12x`` package without a
    ``b12x`` distribution record, so the version of a distribution named
    ``b12x`` says nothing about which b12x is imported.
    """

    path: str | None
    """The file ``import b12x`` runs (the loaded module's, once imported); None: not importable."""
    distribution: str | None
    """The installed distribution whose file list holds ``path``; None: none does."""
    version: str | None
    """That distribution's version."""

    @property
    def provider(self) -> str:
        """``standalone``, ``FlashInfer``, ``unowned`` or ``none``: who ships this b12x."""
        if self.path is None:
            return "none"
        if self.distribution == "b12x":
            return "standalone"
        if self.distribution == "flashinfer-python":
            return "FlashInfer"
        return "unowned" if self.distribution is None else self.distribution

    def describe(self) -> str:
        """``standalone b12x 1.5.1``, ``flashinfer-python 0.7.4``, or where it was found."""
        if self.path is None:
            return "not importable"
        if self.distribution == "b12x":
            return f"standalone b12x {self.version}"
        if self.distribution is not None:
            return f"{self.distribution} {self.version}"
        return f"{self.path} (no installed distribution owns it)"


def b12x_origin() -> B12xOrigin:
    """Where the b12x that ``import b12x`` loads comes from; torch-free, imports nothing.

    The file is the loaded module's when b12x is imported already, else the
    one the import system would run (``importlib.util.find_spec``). Its owner
    is the distribution whose recorded files hold it; where two do (one
    installed over the other), the one whose recorded hash matches the file.
    """
    module = sys.modules.get("b12x")
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        try:
            spec = importlib.util.find_spec("b12x")
        except (ImportError, ValueError):  # ValueError: a module without __spec__
            spec = None
        path = spec.origin if spec is not None and spec.has_location else None
    if path is None:
        return B12xOrigin(None, None, None)
    owner = _owner(Path(path))
    if owner is None:
        return B12xOrigin(path, None, None)
    return B12xOrigin(path, owner.metadata["Name"], owner.version)


def _owner(path: Path) -> importlib.metadata.Distribution | None:
    """The installed distribution whose RECORD lists ``path``."""
    target = path.resolve()
    owners: list[tuple[importlib.metadata.Distribution, str | None]] = []
    for distribution in importlib.metadata.distributions():
        try:
            base = Path(str(distribution.locate_file(""))).resolve()
            relative = target.relative_to(base).as_posix()
        except (ValueError, OSError):
            continue
        # The RECORD's lines read as text: parsing every recorded file into a path
        # (packages_distributions, Distribution.files) cost 0.5 s per look here.
        for recorded, digest in _recorded(distribution, relative):
            if recorded == relative:
                owners.append((distribution, digest))
    if len(owners) > 1:
        found = base64.urlsafe_b64encode(hashlib.sha256(target.read_bytes()).digest())
        for distribution, digest in owners:
            if digest == "sha256=" + found.rstrip(b"=").decode():
                return distribution
    return owners[0][0] if owners else None


def _recorded(
    distribution: importlib.metadata.Distribution, relative: str
) -> Iterator[tuple[str, str | None]]:
    """The recorded files of ``distribution`` that may be ``relative``, each with its hash."""
    record = distribution.read_text("RECORD")
    if record is None:  # an egg-info install: its own listing, without hashes
        for file in distribution.files or ():
            yield file.as_posix(), None
        return
    for line in record.splitlines():
        if relative in line:
            for row in csv.reader([line]):
                yield row[0], row[1] if len(row) > 1 and row[1] else None


def stock_row() -> SeamRow:
    """The stock row whose module the loaded b12x has (the first row if none imports)."""
    stock = rows("stock")
    return next((row for row in stock if row.loaded() is not None), stock[0])


TABLE = Path(__file__).with_name("b12x_releases.json")


def judged(distribution: str, version: str) -> Judged | None:
    """The row of ``distribution==version``; None where the table has none.

    Raises :class:`~flare_l2evict.L2EvictError` (one line: the file, what is
    wrong, reinstall) where the shipped table is unreadable or not a JSON object.
    """
    return judged_row(TABLE, f"{distribution}=={version}")
