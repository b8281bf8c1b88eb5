"""Measurements behind ``flare-l2evict bench`` and the GPU tests.

Figures only: nothing here asserts a timing.
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
