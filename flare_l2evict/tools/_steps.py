"""The tools' DEBUG line of step times (torch-free): what ``-v`` says each step cost."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


def log_steps(log: logging.Logger, what: str, seconds: Mapping[str, float]) -> None:
    """One DEBUG line on ``log``: the wall time of each of ``what``'s steps, in order."""
    if log.isEnabledFor(logging.DEBUG):
        steps = ", ".join(f"{name} {value:.3f} s" for name, value in seconds.items())
        log.debug("flare_l2evict: %s took %s", what, steps or "no steps")


class Steps:
    """Wall time per named step, in the order the steps first ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began
