"""The races' compile guard: b12x's own ``no_compilation()``, with one module stood in.

Where the CuTe DSL is not installed, only ``b12x._lib.compiler`` is replaced
(by a module named as a stand-in), and only while a race runs. These tests run
on a CPU; the GPU test ``test_guard_refuses_a_triton_kernel_never_compiled``
shows the Triton half of the guard refusing a compile for real.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from flare_l2evict.tools.reference_host import _races
from flare_l2evict.tools.reference_host._races import (
    COMPILER_MODULE,
    _compiler_stand_in,
    compiler_stand_in,
    cute_guard,
)

b12x_lib = pytest.importorskip("b12x._lib")


def test_stand_in_has_what_no_compilation_uses_and_refuses_cute() -> None:
    module = _compiler_stand_in()
    assert module.__name__ == COMPILER_MODULE
    assert module.__flare_l2evict_stand_in__ is True
    assert "stand-in" in (module.__doc__ or "")
    assert module.compile_cache_info()["compile_misses"] == 0

    class Spec:
        kernel_id = "gemm_sm90"

    with pytest.raises(RuntimeError, match=r"stand-in .* gemm_sm90 cannot be compiled"):
        module._call_cute_compile(None, None, (), {}, compile_spec=Spec(), cache_key="k")


def test_no_compilation_reaches_the_stand_in_both_ways() -> None:
    """``sys.modules`` and ``from b12x._lib import compiler`` both give the stand-in."""
    with compiler_stand_in() as module:
        assert sys.modules[COMPILER_MODULE] is module
        # Found on the package itself: its lazy __getattr__ would import the CuTe DSL.
        assert b12x_lib.__dict__["compiler"] is module
        from b12x._lib import compiler

        assert compiler is module
        assert importlib.import_module(COMPILER_MODULE) is module


@pytest.mark.parametrize("imported_before", [False, True], ids=["absent", "real-module"])
def test_stand_in_is_undone(monkeypatch: pytest.MonkeyPatch, imported_before: bool) -> None:
    """Afterwards ``sys.modules`` and the package hold exactly what they held before."""
    real = object()
    if imported_before:
        monkeypatch.setitem(sys.modules, COMPILER_MODULE, real)
        monkeypatch.setattr(b12x_lib, "compiler", real, raising=False)
    else:
        monkeypatch.delitem(sys.modules, COMPILER_MODULE, raising=False)
        monkeypatch.delitem(b12x_lib.__dict__, "compiler", raising=False)
    with pytest.raises(KeyError), compiler_stand_in():
        raise KeyError("a race that fails still restores")
    if imported_before:
        assert sys.modules[COMPILER_MODULE] is real
        assert b12x_lib.__dict__["compiler"] is real
    else:
        assert COMPILER_MODULE not in sys.modules
        assert "compiler" not in b12x_lib.__dict__


@pytest.mark.parametrize("installed", [False, True], ids=["no-cute-dsl", "cute-dsl"])
def test_cute_guard_stands_in_only_without_the_cute_dsl(
    monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    monkeypatch.setattr(_races, "cute_dsl_installed", lambda: installed)
    before = sys.modules.get(COMPILER_MODULE)
    with cute_guard() as stood_in:
        inside = sys.modules.get(COMPILER_MODULE)
    assert stood_in is (not installed)
    if installed:
        assert inside is before  # nothing changed
    else:
        assert getattr(inside, "__flare_l2evict_stand_in__", False) is True
    assert sys.modules.get(COMPILER_MODULE) is before


def test_b12x_guard_runs_on_the_stand_in() -> None:
    """b12x's own ``no_compilation()`` enters and leaves with the stand-in (needs Triton)."""
    pytest.importorskip("triton")
    measurement = importlib.import_module("b12x.preparation._measurement")
    with compiler_stand_in() as module, measurement.no_compilation() as observed:
        assert observed.compiler is module
    assert observed.cute == 0 and observed.triton == 0
