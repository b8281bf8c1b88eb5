"""Real b12x races on a CUDA device: candidates, the compile guard, and one race.

Everything timed here is b12x's own code (``prepare_race_steps`` and
``measure_race_steps``), and so is the guard every race runs under: b12x's
``no_compilation()``, which refuses any Triton program that is neither in
memory nor on disk (a compilation listener, wraps of ``JITFunction.run``,
``JITFunction._do_compile`` and ``CompiledKernel``, and ``forbid_lowering``)
and any CuTe program. Its one import that needs the CuTe DSL
(``nvidia-cutlass-dsl``, ~92 MB wheels) is ``b12x._lib.compiler``; where the
DSL is not installed, :func:`cute_guard` stands in for that module alone
(:func:`_compiler_stand_in`, which refuses every CuTe compile) and says so. The
Triton half of the guard stays b12x's own.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..._b12x.table import ROOTS, SeamRow
from .._origin import stock_row

COMPILER_MODULE = "b12x._lib.compiler"
"""The one module of b12x's guard that imports the CuTe DSL."""

_ABSENT = object()


def _compiler_stand_in() -> types.ModuleType:
    """A module named ``b12x._lib.compiler`` with only what ``no_compilation()`` uses of it.

    A stand-in, named as such (``__flare_l2evict_stand_in__``): without the
    CuTe DSL no CuTe program can be built, so its compile counter stays at 0
    and its ``_call_cute_compile`` refuses, as b12x's guard itself would
    inside a race.
    """
    module = types.ModuleType(
        COMPILER_MODULE,
        "flare-l2evict stand-in for b12x._lib.compiler (the CuTe DSL is not installed): "
        "it compiles nothing and refuses every CuTe compile.",
    )

    def compile_cache_info() -> dict[str, int | bool]:
        return {"compile_misses": 0}

    def _call_cute_compile(*_args: object, **kwargs: object) -> object:
        name = getattr(kwargs.get("compile_spec"), "kernel_id", "unknown")
        raise RuntimeError(
            f"stand-in for {COMPILER_MODULE}: the CuTe DSL is not installed, so the CuTe "
            f"program {name} cannot be compiled"
        )

    module.compile_cache_info = compile_cache_info  # type: ignore[attr-defined]
    module._call_cute_compile = _call_cute_compile  # type: ignore[attr-defined]
    module.__flare_l2evict_stand_in__ = True  # type: ignore[attr-defined]
    return module


@contextlib.contextmanager
def compiler_stand_in() -> Iterator[types.ModuleType]:
    """``b12x._lib.compiler`` is :func:`_compiler_stand_in` inside, as it was outside.

    Both ways b12x reaches the module are covered: ``sys.modules`` and the
    attribute of the package ``b12x._lib`` (``from b12x._lib import compiler``
    asks the package first, and its lazy ``__getattr__`` would import the real
    module, CuTe DSL and all).
    """
    package = importlib.import_module("b12x._lib")
    module = _compiler_stand_in()
    saved_module = sys.modules.get(COMPILER_MODULE, _ABSENT)
    saved_attribute = package.__dict__.get("compiler", _ABSENT)
    sys.modules[COMPILER_MODULE] = module
    package.compiler = module  # type: ignore[attr-defined]
    try:
        yield module
    finally:
        if saved_module is _ABSENT:
            sys.modules.pop(COMPILER_MODULE, None)
        else:
            sys.modules[COMPILER_MODULE] = saved_module  # type: ignore[assignment]
        if saved_attribute is _ABSENT:
            package.__dict__.pop("compiler", None)
        else:
            package.compiler = saved_attribute  # type: ignore[attr-defined]


def cute_dsl_installed() -> bool:
    """Whether the CuTe DSL (``cutlass``) imports, so b12x's guard runs unchanged."""
    try:
        importlib.import_module("cutlass")
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def cute_guard() -> Iterator[bool]:
    """Races inside run under b12x's real ``no_compilation()``; yields ``True`` if stood in.

    ``True``: the CuTe DSL is not installed and ``b12x._lib.compiler`` was the
    stand-in for the duration (Triton's half of the guard was real); ``False``:
    nothing was changed.
    """
    importlib.import_module(stock_row().module_path)  # b12x must be there either way
    if cute_dsl_installed():
        yield False
        return
    with compiler_stand_in():
        yield True


def gemm_candidates(
    device: torch.device, *, m: int = 256, n: int = 8192, k: int = 8192
) -> list[Any]:
    """Two candidates that differ clearly: one GEMM, and the same GEMM three times.

    The inputs are written by ``produce`` (as a race's activations are), so the
    eviction before each sample leaves them cold in both candidates.
    """
    from b12x.preparation.types import PreparedCall

    x = torch.empty(m, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(k, n, dtype=torch.bfloat16, device=device)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)

    def produce() -> None:
        x.normal_()

    def once() -> None:
        torch.mm(x, w, out=out)

    def thrice() -> None:
        for _ in range(3):
            torch.mm(x, w, out=out)

    return [PreparedCall(run=once, produce=produce), PreparedCall(run=thrice, produce=produce)]


@dataclass(frozen=True)
class RaceResult:
    """One race: each candidate's latency in microseconds and the winner's index."""

    latencies_us: tuple[float, ...]

    @property
    def winner(self) -> int:
        return min(range(len(self.latencies_us)), key=self.latencies_us.__getitem__)


def run_race(
    calls: Sequence[Any],
    device: torch.device,
    eviction: Callable[[], None] | None,
    *,
    samples: int = 2,
    rounds: int = 5,
) -> RaceResult:
    """Prepare and measure one race through b12x's own generators.

    ``eviction=None`` lets b12x allocate its own buffer, as a race outside a
    ``PreparationJob`` does; a job passes the eviction it holds.
    """
    measurement = importlib.import_module(_races_module_path(stock_row()))
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    prepared = measurement._consume(
        measurement.prepare_race_steps(
            list(calls), device_ordinal=ordinal, samples=samples, eviction=eviction
        )
    )
    try:
        measured = measurement._consume(
            measurement.measure_race_steps(prepared, device_ordinal=ordinal, rounds=rounds)
        )
    finally:
        prepared.close()
    return RaceResult(tuple(measured.latencies_us))


def _races_module_path(row: SeamRow) -> str:
    """The module of the race code (the row's first caller): ``prepare_race_steps`` and friends."""
    module = row.callers[0][0] if row.callers else row.module
    return f"{ROOTS[0]}.{module}"
