"""Which b12x provider and torch this environment has, and whether the plugin can use them.

b12x ships standalone (distribution ``b12x``) and inside flashinfer-python
(>= 0.7.2), whose wheel installs a top-level ``b12x`` package of its own. The
provider is the host's: the plugin never installs one into a server. This
module names what is there, torch-free and without importing b12x, so that
start-up can fall back with one line saying what was found and what is needed.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

MIN_TORCH = (2, 4)
"""The oldest torch whose APIs the plugin uses (see pyproject.toml's torch floor)."""
MIN_FLASHINFER = "0.7.2"
"""The first flashinfer-python that ships b12x with the race seam."""
MIN_B12X = "1.5"
"""The first standalone b12x with ``b12x.preparation`` (its start-up races)."""
NEEDED = f"flashinfer-python>={MIN_FLASHINFER} or b12x>={MIN_B12X}"


def versions() -> tuple[str | None, str | None]:
    """The installed ``b12x`` and ``flashinfer-python`` distributions' versions."""
    return _version("b12x"), _version("flashinfer-python")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def running_torch_version() -> str | None:
    """The version of the torch that runs (``torch.__version__``), not of stale metadata.

    A leftover ``torch-2.3.1.dist-info`` on ``sys.path`` must not stand for
    the torch 2.13 that is imported; metadata is asked only before torch is.
    """
    loaded = getattr(sys.modules.get("torch"), "__version__", None)
    return str.__str__(loaded) if isinstance(loaded, str) else _version("torch")


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version (``2.13.0+cpu`` -> (2, 13, 0))."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def provider_problem() -> str | None:
    """One line naming what this environment has and what the plugin needs, or None.

    None means torch is new enough and an importable b12x exists: the seam
    proof then decides. A line means start-up must keep stock b12x; the line
    names the torch or provider found (versions from the installed
    distributions, as pip sees them) and the requirement it misses; the
    caller says that stock b12x is kept. Never
    raises, imports no b12x module (only looks b12x up) and changes nothing.
    """
    torch_version = running_torch_version()
    if torch_version is not None and _release(torch_version) < MIN_TORCH:
        needed = ".".join(map(str, MIN_TORCH))
        return (
            f"torch {torch_version} found; the plugin needs torch>={needed} "
            "(upgrade torch with the server, or leave the plugin off)"
        )
    try:
        spec = importlib.util.find_spec("b12x")
    except (ImportError, ValueError):  # ValueError: a b12x module without __spec__
        spec = None
    if spec is not None and spec.origin not in (None, "namespace"):
        return None
    b12x, flashinfer = versions()
    if spec is not None:
        where = ", ".join(spec.submodule_search_locations or ()) or "sys.path"
        return (
            f"b12x at {where} is an empty namespace package (what uninstalling "
            "flashinfer-python leaves over a standalone b12x); the plugin needs "
            f"{NEEDED} (reinstall the server's b12x provider)"
        )
    found = []
    if flashinfer is not None:
        ships = _release(flashinfer) >= _release(MIN_FLASHINFER)
        found.append(f"flashinfer-python {flashinfer}" + ("" if ships else " (ships no b12x)"))
    if b12x is not None:
        found.append(f"b12x {b12x}")
    what = " and ".join(found) + ", but no importable b12x" if found else "no b12x provider"
    return f"{what} found; the plugin needs {NEEDED}"


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
