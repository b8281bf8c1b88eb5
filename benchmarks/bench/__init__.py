"""Measurements behind ``python -m benchmarks.bench`` and the GPU tests.

Figures only: nothing here asserts a timing. It lives in the checkout, not in
the wheel: a server's image carries the plugin and the operator's tools only.
"""

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
