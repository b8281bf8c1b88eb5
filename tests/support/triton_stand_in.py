"""Triton 3.6's ``do_bench`` and driver config, vendored (``triton_3_6/``), a CPU driver
stand-in, and a module tree of them set into ``sys.modules`` (:func:`triton_imported`), so the
Triton wing's tests, and start-ups with the wing, run where Triton is not installed (CPU, CI)."""

from __future__ import annotations
import __future__

import contextlib
import math
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator
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


class TritonModulesStandIn:
    """A host that imported Triton 3.6, on the CPU: ``triton``, ``triton.testing`` (the vendored
    ``do_bench``), ``triton.runtime`` (its ``driver``, a vendored ``DriverConfig``) and
    ``triton.backends.nvidia.driver`` (``CudaDriver`` is ``cuda``, a stand-in class) set into
    ``sys.modules`` by :func:`triton_imported`, and taken out after."""

    def __init__(self, driver: object, cuda: type) -> None:
        self.config = vendored_config(lambda: driver)
        self.driver = driver
        self.cuda = cuda
        self.do_bench: Callable[..., Any] = vendored_testing(self.config).do_bench
        triton, testing, runtime, backends, nvidia, nvidia_driver = (
            types.ModuleType(name)
            for name in (
                "triton",
                "triton.testing",
                "triton.runtime",
                "triton.backends",
                "triton.backends.nvidia",
                "triton.backends.nvidia.driver",
            )
        )
        triton.__version__ = "3.6.0"  # type: ignore[attr-defined]
        testing.do_bench = self.do_bench  # type: ignore[attr-defined]
        runtime.driver = self.config  # type: ignore[attr-defined]
        nvidia_driver.CudaDriver = cuda  # type: ignore[attr-defined]
        triton.testing, triton.runtime, triton.backends = testing, runtime, backends  # type: ignore[attr-defined]
        backends.nvidia, nvidia.driver = nvidia, nvidia_driver  # type: ignore[attr-defined]
        self.modules = {m.__name__: m for m in (triton, testing, runtime, backends, nvidia)}
        self.modules[nvidia_driver.__name__] = nvidia_driver

    def stock(self) -> bool:
        """Whether the driver's two methods are its class's own again (no instance attribute)."""
        return not {"get_empty_cache_for_benchmark", "clear_cache"} & set(vars(self.driver))


@contextlib.contextmanager
def triton_imported(
    driver: object | None = None, cuda: type = CudaDriverStandIn, *, cpu_served: bool = True
) -> Iterator[TritonModulesStandIn]:
    """:class:`TritonModulesStandIn` in ``sys.modules`` for the block, around ``driver`` (a
    fresh :class:`CudaDriverStandIn`), then gone. ``cpu_served``: the wing serves the CPU as it
    serves CUDA, so the reference host's start-up installs it (the CPU stands in for CUDA)."""
    from flare_l2evict._triton import wing

    made = TritonModulesStandIn(CudaDriverStandIn() if driver is None else driver, cuda)
    clash = [name for name in made.modules if name in sys.modules]
    assert not clash, f"a Triton is imported already: {clash}"
    served = wing.SERVED_DEVICES
    sys.modules.update(made.modules)
    if cpu_served:
        wing.SERVED_DEVICES = served | {"cpu"}
    try:
        yield made
    finally:
        wing.SERVED_DEVICES = served
        for name in made.modules:
            sys.modules.pop(name, None)
