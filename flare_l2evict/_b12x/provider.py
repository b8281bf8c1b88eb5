"""Which b12x provider and torch this environment has, and whether the plugin can use them.

b12x ships standalone and inside flashinfer-python (>= 0.7.2). The provider is
the host's: the plugin never installs one, and this module imports no b12x.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys

MIN_TORCH = (2, 4)
"""The oldest torch whose APIs the plugin uses (see pyproject.toml's torch floor)."""
MIN_FLASHINFER = "0.7.2"
"""The first flashinfer-python that ships b12x with the race seam."""
MIN_B12X = "1.5"
"""The first standalone b12x with ``b12x.preparation`` (its start-up races)."""
NEEDED = f"flashinfer-python>={MIN_FLASHINFER} or b12x>={MIN_B12X}"


def versions() -> tuple[str | None, str | None]:
    """The installed ``b12x`` and ``flashinfer-python`` distributions' versions."""
    return installed_version("b12x"), installed_version("flashinfer-python")


def installed_version(name: str) -> str | None:
    """The installed distribution's version: ``None`` when it is not installed, or when its
    metadata names no version (never the text ``"None"``). The one lookup of an installed
    version, for the runtime and the tools alike; found without raising.

    b12x has no distribution of its own where flashinfer-python ships it, so a raise and
    catch here would run on every start-up; no exception is handled on the start-up's
    path (under CPython 3.11 one raised from a trace function inside a handler leaves the
    handled one on the thread, and with it every frame above, the host's weights too).
    """
    for found in importlib.metadata.distributions(name=name):
        # get_all, not [] or .version: a missing field is None, with no warning (3.12 warns).
        version = (found.metadata.get_all("Version") or [None])[0]
        return str.__str__(version) if isinstance(version, str) and version.strip() else None
    return None


def running_torch_version() -> str | None:
    """The version of the torch that runs (``torch.__version__``), not of stale metadata."""
    loaded = getattr(sys.modules.get("torch"), "__version__", None)
    return str.__str__(loaded) if isinstance(loaded, str) else installed_version("torch")


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version (``2.13.0+cpu`` -> (2, 13, 0))."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def provider_problem() -> str | None:
    """One line naming what this environment has and what the plugin needs, or None: torch is
    new enough and a b12x is importable (the seam proof decides). Never raises, imports no b12x
    module and changes nothing."""
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
