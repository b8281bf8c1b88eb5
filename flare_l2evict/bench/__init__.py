"""GPU measurements behind ``flare-l2evict bench`` and the GPU tests.

Figures only: nothing here asserts a timing.
"""

from ._probe import Probe, ProbeTimes, compare, time_after, time_call

__all__ = ["Probe", "ProbeTimes", "compare", "time_after", "time_call"]
