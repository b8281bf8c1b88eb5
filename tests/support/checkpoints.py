"""Checkpoint files the tests write without writing their zeros."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings, strategies as st

from flare_l2evict.tools.reference_host._example import write_headers


def sparse_zeros(path: Path, shapes: Mapping[str, tuple[int, ...]]) -> Path:
    """A float32 safetensors file of zeros, as ``save_file`` of ``torch.zeros`` tensors writes
    it, but its data a sparse hole: the same file for ``plan`` and ``check`` (they read the
    header) and for a start-up (it loads zeros), without a test allocating and writing them.
    """
    return write_headers(path, [(name, "F32", shape) for name, shape in shapes.items()])


# What the property tests that hold plan, check and start-up to one another draw from.
KiB = 1 << 10
SIZES = (0, 1, 64 * KiB, 256 * KiB, 512 * KiB, 768 * KiB, 1 << 20)
"""Tensor bytes: empty, one byte, and a few sizes around the windows below."""
names = st.from_regex(r"model\.layers\.[0-9]{1,2}\.(mlp|attn)\.[a-z_]{1,8}", fullmatch=True)
SECTION: dict[str, st.SearchStrategy[Any]] = {
    "window_kib": st.sampled_from([1024, 1536, 2048, 3072]),
    "exclude": st.sampled_from([[], ["*.attn.*"], ["model.layers.1*"]]),
    "race_jobs": st.integers(0, 6),
    "enabled": st.sampled_from([True, True, True, False]),
}
"""A deployment's section (as ``@given(**SECTION)`` arguments) and the race jobs it credits."""


def section(window_kib: int, exclude: list[str], enabled: bool) -> dict[str, Any]:
    """The deployment config those arguments make."""
    return {
        "plugins": {"l2evict": {"window": window_kib * KiB, "exclude": exclude, "enabled": enabled}}
    }


def property_test(examples: int) -> settings:
    """hypothesis' settings for a property over real files: no deadline, function fixtures."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
