"""Wall time per named step (torch-free): the report's ``seconds``, and ``-v``'s step times."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Clock:
    """Wall time per named step, in the order the steps first ran, and since it was made."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

    def total(self) -> dict[str, float]:
        return {**self.seconds, "total": time.perf_counter() - self.started}
