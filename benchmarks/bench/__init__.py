"""Measurements behind ``python -m benchmarks.bench`` and the GPU tests.

Figures only: nothing here asserts a timing. It lives in the checkout, not in
the wheel: a server's image carries the plugin and the operator's tools only.

The names below load on first use: ``python -m benchmarks.bench`` imports this
package first, and its ``--help`` and usage errors (a machine without a GPU
driver among them) must not wait for torch's import.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._hook_cost import first_call_times
    from ._probe import Probe, ProbeTimes, compare, time_after, time_call
    from ._synthetic import synthetic_checkpoint

__all__ = [
    "Probe",
    "ProbeTimes",
    "compare",
    "first_call_times",
    "synthetic_checkpoint",
    "time_after",
    "time_call",
]

_HOMES = {
    "first_call_times": "._hook_cost",
    "Probe": "._probe",
    "ProbeTimes": "._probe",
    "compare": "._probe",
    "time_after": "._probe",
    "time_call": "._probe",
    "synthetic_checkpoint": "._synthetic",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home, __name__), name)
