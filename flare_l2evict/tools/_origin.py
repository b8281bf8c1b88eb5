"""Where the b12x that ``import b12x`` loads comes from, and its seam row (no runtime use)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from .._b12x.table import SeamRow, rows


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
    tops: set[str] = set()
    for entry in sys.path:
        try:
            relative = target.relative_to(Path(entry or ".").resolve())
        except (ValueError, OSError):
            continue
        if relative.parts:
            tops.add(relative.parts[0].removesuffix(".py"))
    names = {
        name
        for top in sorted(tops)
        for name in importlib.metadata.packages_distributions().get(top, [])
    }
    owners: list[tuple[importlib.metadata.Distribution, importlib.metadata.PackagePath]] = []
    for name in sorted(names):
        try:
            distribution = importlib.metadata.distribution(name)
            relative_name = target.relative_to(Path(str(distribution.locate_file(""))).resolve())
        except (importlib.metadata.PackageNotFoundError, ValueError, OSError):
            continue
        for recorded in distribution.files or ():
            if recorded.as_posix() == relative_name.as_posix():
                owners.append((distribution, recorded))
    if len(owners) > 1:
        for distribution, recorded in owners:
            if recorded.hash is not None and recorded.hash.mode == "sha256":
                digest = hashlib.sha256(target.read_bytes()).digest()
                if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == recorded.hash.value:
                    return distribution
    return owners[0][0] if owners else None


def stock_row() -> SeamRow:
    """The stock row whose module the loaded b12x has (the first row if none imports)."""
    stock = rows("stock")
    return next((row for row in stock if row.loaded() is not None), stock[0])
