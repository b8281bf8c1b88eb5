"""The checkout's ``scripts/`` as modules, each loaded once from its file (they are no package)."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@functools.cache
def script(name: str) -> ModuleType:
    """``scripts/NAME.py``, imported as the module ``NAME`` (once per test run)."""
    if str(SCRIPTS) not in sys.path:  # as running one puts it first: their shared modules
        sys.path.append(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses and pickling look their module up
    spec.loader.exec_module(module)
    return module


def discovery_without(
    releases: Any, removed: str, tmp_path: Path, registry: Callable[[str], list[str]]
) -> int:
    """``--discover`` of a release script (``releases``, from :func:`script`) against its
    table with the row ``removed`` taken out, on ``registry``'s version lists: its exit code
    (its lines go to the caller's captured stderr)."""
    table = releases.read_table()
    del table[removed]
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    argv = ["--discover", "--table", str(path)]
    code: int = releases.main(argv, list_versions=registry)
    return code
