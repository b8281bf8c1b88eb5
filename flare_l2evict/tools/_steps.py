"""The tools' DEBUG line of step times (torch-free): what ``-v`` says each step cost."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from .._clock import Clock as Steps  # the core's own step clock (torch-free)

__all__ = ["Steps", "log_steps"]


def log_steps(log: logging.Logger, what: str, seconds: Mapping[str, float]) -> None:
    """One DEBUG line on ``log``: the wall time of each of ``what``'s steps, in order."""
    if log.isEnabledFor(logging.DEBUG):
        steps = ", ".join(f"{name} {value:.3f} s" for name, value in seconds.items())
        log.debug("flare_l2evict: %s took %s", what, steps or "no steps")
