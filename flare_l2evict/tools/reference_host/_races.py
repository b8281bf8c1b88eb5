"""Real b12x races on a CUDA device: candidates, the compile guard, and one race.

Everything timed here is b12x's own code (``prepare_race_steps`` and
``measure_race_steps``). The one exception is b12x's no-compilation guard,
which imports the CuTe DSL compiler (``nvidia-cutlass-dsl``, ~92 MB wheels):
where that is not installed, :func:`cute_guard` swaps the guard for a no-op
and says so; nothing compiled here is CuTe, so the guard has nothing to guard.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@contextlib.contextmanager
def _no_compilation_stand_in() -> Iterator[None]:
    """Stand-in for b12x's ``no_compilation`` when the CuTe DSL is not installed."""
    yield None


@contextlib.contextmanager
def cute_guard() -> Iterator[bool]:
    """Yields ``True`` when b12x's guard was replaced by the no-op stand-in."""
    measurement: Any = importlib.import_module("b12x.preparation._measurement")
    try:
        importlib.import_module("cutlass")
    except ImportError:
        original = measurement.no_compilation
        measurement.no_compilation = _no_compilation_stand_in
        try:
            yield True
        finally:
            measurement.no_compilation = original
        return
    yield False


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
    measurement = importlib.import_module("b12x.preparation._measurement")
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
