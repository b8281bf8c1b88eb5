"""Fake b12x releases written to disk and imported for real: the faults no release has yet.

Each fake is a package ``b12x`` with ``preparation._measurement`` and
``preparation.session`` shaped like stock b12x 1.5, with one fault. Its seam
allocates on the CPU and records every buffer's bytes in ``ALLOCATED`` so a
test can count what the races really allocated.

Also the fork's API put into the loaded b12x (:func:`use_fork_api`), and a flashinfer-python
wheel that ships no b12x (:func:`wheel_without_b12x`) for ``scripts/b12x_releases.py``.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from flare_l2evict._b12x.table import rows

MEASUREMENT = """
import torch

L2 = {l2}
ALLOCATED = []


def _l2_flush_fn(device, *, enabled):
    {guard}
    buffer = torch.ones(({factor} * L2 + 3) // 4, dtype=torch.float32, device=device)
    out = torch.empty((), dtype=torch.float32, device=device)
    ALLOCATED.append(buffer.untyped_storage().nbytes() + out.untyped_storage().nbytes())

    def flush():
        torch.sum(buffer, dim=0, out=out)

    return flush


def prepare_race_steps(calls, *, device_ordinal=None, eviction=None):
    if eviction is None:
        eviction = {race_maker}(torch.device("cpu"), enabled=True)
    eviction()
    return eviction
"""

_SESSION = """
{top}

class PreparationJob:
    def __init__(self, device):
        self.device = device
        self._race_eviction = None

    def _measure(self):
        {inside}
        if self._race_eviction is None:
            self._race_eviction = {call}
        return self._race_eviction
"""
_SEAM_CALL = "_l2_flush_fn(self.device, enabled=True)"
_IMPORT = "from ._measurement import _l2_flush_fn"

SESSION_AT_CALL = _SESSION.format(top="", inside=_IMPORT, call=_SEAM_CALL)
"""Stock's shape: the seam is imported inside ``_measure``, so it is looked up per call."""
SESSION_BOUND_AT_IMPORT = _SESSION.format(top=_IMPORT, inside="", call=_SEAM_CALL)
"""The seam is bound once, at import, to a name of the session module."""
SESSION_NEW_MODULE = _SESSION.format(
    top="",
    inside="from ._eviction import make_eviction",
    call="make_eviction(self.device)",
)
"""The job's eviction is made in another module, without the seam."""

EVICTION_MODULE = """
from ._measurement import ALLOCATED, L2
import torch


def make_eviction(device):
    buffer = torch.ones((2 * L2 + 3) // 4, dtype=torch.float32, device=device)
    ALLOCATED.append(buffer.untyped_storage().nbytes())
    return lambda: buffer.sum()
"""


def write_fake(
    root: Path,
    *,
    l2: int,
    factor: int = 2,
    session: str = SESSION_AT_CALL,
    seam_raises: bool = False,
    race_maker: str = "_l2_flush_fn",
) -> Path:
    package = root / "b12x"
    (package / "preparation").mkdir(parents=True)
    (package / "__init__.py").write_text('"""fake b12x"""\n')
    (package / "preparation" / "__init__.py").write_text("")
    guard = (
        'raise RuntimeError("seam broken")'
        if seam_raises
        else "if not enabled:\n        return None"
    )
    if race_maker != "_l2_flush_fn":
        race_maker = "__import__('b12x.preparation._eviction').preparation._eviction.make_eviction"
    measurement = MEASUREMENT.format(l2=l2, factor=factor, guard=guard, race_maker=race_maker)
    (package / "preparation" / "_measurement.py").write_text(textwrap.dedent(measurement))
    (package / "preparation" / "session.py").write_text(textwrap.dedent(session))
    (package / "preparation" / "_eviction.py").write_text(textwrap.dedent(EVICTION_MODULE))
    return root


def write_moved_fake(
    root: Path, *, l2: int, module: str, function: str, keywords: bool = False
) -> Path:
    """A release whose seam moved: ``preparation.<module>.<function>``, stock's shape otherwise.

    No ``preparation._measurement`` exists; the session imports the new name at call time.
    ``keywords``: the seam's signature changed too, to ``(*, enabled, device)``, and every
    caller passes both by keyword.
    """
    package = root / "b12x"
    (package / "preparation").mkdir(parents=True)
    (package / "__init__.py").write_text('"""fake b12x, seam moved"""\n')
    (package / "preparation" / "__init__.py").write_text("")
    guard = "if not enabled:\n        return None"
    text = MEASUREMENT.format(l2=l2, factor=2, guard=guard, race_maker=function)
    text = text.replace("def _l2_flush_fn(", f"def {function}(")
    call = f"{function}(self.device, enabled=True)"
    if keywords:
        text = text.replace(
            f"def {function}(device, *, enabled)", f"def {function}(*, enabled, device)"
        )
        text = text.replace(
            f'{function}(torch.device("cpu"), enabled=True)',
            f'{function}(enabled=True, device=torch.device("cpu"))',
        )
        call = f"{function}(enabled=True, device=self.device)"
    (package / "preparation" / f"{module}.py").write_text(textwrap.dedent(text))
    session = _SESSION.format(top="", inside=f"from .{module} import {function}", call=call)
    (package / "preparation" / "session.py").write_text(textwrap.dedent(session))
    return root


def use_fake(
    monkeypatch: pytest.MonkeyPatch, root: Path, seam: str = "preparation._measurement"
) -> ModuleType:
    """Hide the real b12x (both import names) for this test and import the fake's seam module."""
    for name in list(sys.modules):
        if name == "b12x" or name.startswith(("b12x.", "flashinfer.experimental.b12x")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return importlib.import_module(f"b12x.{seam}")


def job_evictions(jobs: int) -> list[Callable[[], object]]:
    """Start ``jobs`` race jobs of the loaded fake the way its session does."""
    session = importlib.import_module("b12x.preparation.session")
    import torch

    made = [session.PreparationJob(torch.device("cpu"))._measure() for _ in range(jobs)]
    for eviction in made:
        eviction()
    return made


def use_fork_api(
    monkeypatch: pytest.MonkeyPatch, use_startup_eviction: Callable[..., object]
) -> ModuleType:
    """Make the loaded b12x a fork for this test: the fork row's module (``b12x.comm.pcie``)
    holds ``use_startup_eviction``, a stand-in for the fork's API (one that notes each storage
    it is handed, refuses ``None``, or has another signature). Returns that module.

    The plugin checks its signature against the row's ``(storage)``: a builtin such as
    ``list.append`` (``(object, /)``) is refused as a fork of another shape.
    """
    (row,) = rows("fork")
    module = ModuleType(row.module_path)
    setattr(module, row.function, use_startup_eviction)
    monkeypatch.setitem(sys.modules, row.module_path, module)
    return module


def wheel_without_b12x(cache: Path, version: str = "0.7.9") -> Path:
    """A flashinfer-python wheel stand-in in ``cache`` (made if missing): its ``flashinfer``
    package ships no b12x, as a release that dropped it would. Returns the wheel's path."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"flashinfer_python-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("flashinfer/__init__.py", "")
    return path
