"""Triton 3.6's ``do_bench`` and driver config, vendored (``triton_3_6/``), and a CPU driver
stand-in, so the Triton wing's tests run where Triton is not installed (CPU, CI)."""

from __future__ import annotations
import __future__

import math
import statistics
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flare_l2evict._eviction import WeightEviction
from flare_l2evict.tools._choose_weights import choose_weights

EXCERPTS = Path(__file__).parent / "triton_3_6"


def excerpt(name: str) -> str:
    """The text of one vendored excerpt (``testing.py`` or ``runtime_driver.py``)."""
    return (EXCERPTS / f"{name}.txt").read_text(encoding="utf-8")


def _run(name: str, space: dict[str, Any]) -> dict[str, Any]:
    # The original files start with `from __future__ import annotations`.
    flags = __future__.annotations.compiler_flag
    exec(compile(excerpt(name), str(EXCERPTS / name), "exec", flags, dont_inherit=True), space)
    return space


def vendored_testing(config: object) -> types.SimpleNamespace:
    """``triton.testing`` as far as 3.6's ``do_bench`` goes, reading ``config`` as its
    ``runtime.driver``."""
    runtime = types.SimpleNamespace(driver=config)
    space = _run("testing.py", {"math": math, "statistics": statistics, "runtime": runtime})
    return types.SimpleNamespace(do_bench=space["do_bench"])


def vendored_config(create: Callable[[], object]) -> Any:
    """A fresh ``triton.runtime.driver`` (3.6's ``DriverConfig``) whose default is ``create()``."""
    return _run("runtime_driver.py", {"_create_driver": create})["DriverConfig"]()


class CpuEventStandIn:
    """``torch.cuda.Event`` as ``do_bench`` uses it, timed on the host."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: CpuEventStandIn) -> float:
        return max((end.at - self.at) * 1e3, 1e-3)  # ms; never 0 (do_bench divides by it)


class CpuDeviceInterfaceStandIn:
    """``torch.cuda`` as ``do_bench`` uses it: events and a synchronise that waits for nothing."""

    Event = CpuEventStandIn

    @staticmethod
    def synchronize() -> None:
        pass


class CudaDriverStandIn:
    """CUDA's driver as ``do_bench`` sees it, on the CPU: stock's two flush methods with a small
    buffer (:attr:`BUFFER_BYTES` for stock's 256 MiB), counting what they were asked."""

    BUFFER_BYTES = 1 << 16

    def __init__(self) -> None:
        self.made = 0
        self.cleared: list[object] = []

    def get_device_interface(self) -> type[CpuDeviceInterfaceStandIn]:
        return CpuDeviceInterfaceStandIn

    def get_empty_cache_for_benchmark(self) -> torch.Tensor:
        self.made += 1
        return torch.empty(self.BUFFER_BYTES // 4, dtype=torch.int)

    def clear_cache(self, cache: Any) -> None:
        self.cleared.append(cache)
        cache.zero_()


class HIPDriverStandIn(CudaDriverStandIn):
    """AMD's driver: the same two methods, another class."""


def weights_eviction(
    words: int = 4096, window_bytes: int = 4096
) -> tuple[torch.Tensor, WeightEviction]:
    """Resident CPU weights (ones; keep them) and an eviction reading ``window_bytes`` of them."""
    weights = torch.ones(words)
    return weights, WeightEviction(choose_weights({"w": weights}, "cpu", window_bytes))
