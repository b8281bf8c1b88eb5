"""The checkout's ``scripts/`` as modules, each loaded once from its file (they are no package)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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
