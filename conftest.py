"""Shared fixtures and the ``gpu`` marker (skipped without CUDA)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import flare_l2evict
from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime

MiB = 1 << 20


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _stock_b12x_after_each_test() -> Iterator[None]:
    """No test leaks an installed eviction or a plugin start-up into the next."""
    yield
    from support.startups import end_any

    end_any()
    flare_l2evict.restore()


@pytest.fixture
def write_checkpoint(tmp_path: Path) -> Callable[[dict[str, torch.Tensor], str], Path]:
    """Write real safetensors files under the test's temporary directory."""
    from safetensors.torch import save_file

    def write(tensors: dict[str, torch.Tensor], name: str = "model.safetensors") -> Path:
        path = tmp_path / name
        save_file(tensors, str(path))
        return path

    return write


@pytest.fixture
def make_runtime() -> Callable[..., ReferenceRuntime]:
    """The reference host's runtime object around given tensors (CPU, small L2)."""

    def make(
        tensors: dict[str, torch.Tensor],
        *,
        config: Mapping[str, Any] | None = None,
        l2_cache_bytes: int = 32 * MiB,
        race_jobs: int = 5,
        device: str = "cpu",
    ) -> ReferenceRuntime:
        return ReferenceRuntime(
            device=torch.device(device),
            config=config or {},
            kv_allocator=ReferenceKVAllocator(1024),
            race_jobs=race_jobs,
            l2_cache_bytes=l2_cache_bytes,
            tensors=tensors,
        )

    return make
