"""Property tests: the credit never exceeds what stock would have allocated, and the hook
never raises under ``on_error = "fallback"``, whatever the host passes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from support.figures import MiB
from support.hosts import hook
from support.startups import end_any, eviction_of, installed

from flare_l2evict._credit import credit, stock_buffer_bytes
from flare_l2evict.tools.reference_host import ReferenceKVAllocator

pytest.importorskip("b12x.preparation._measurement")

sizes = st.integers(min_value=-(1 << 40), max_value=1 << 40)


@given(
    installable=st.booleans(),
    race_jobs=st.integers(min_value=-5, max_value=2048),
    stock=sizes,
    window=sizes,
    read=sizes,
    free=st.one_of(st.none(), sizes),
)
def test_credit_is_bounded_and_zero_unless_the_window_is_read(
    installable: bool, race_jobs: int, stock: int, window: int, read: int, free: int | None
) -> None:
    got = credit(
        installable=installable,
        race_jobs=race_jobs,
        stock_buffer_bytes=stock,
        window_bytes=window,
        read_bytes=read,
        free_bytes=free,
    )
    assert 0 <= got.nbytes <= max(0, race_jobs) * max(0, stock)
    if not installable or read < window or window <= 0:
        assert got.nbytes == 0
    assert (got.nbytes == 0) == (got.reason is not None)
    uncut = credit(
        installable=installable,
        race_jobs=race_jobs,
        stock_buffer_bytes=stock,
        window_bytes=window,
        read_bytes=read,
    )
    assert uncut.uncut_bytes is None  # no free figure (off CUDA): never cut
    if free is None or uncut.nbytes <= max(0, free):  # within what is free: as without it
        assert got == uncut
    else:  # past it: cut to it, and the credit it was cut from is kept
        assert got.nbytes == max(0, free) < uncut.nbytes == got.uncut_bytes


@dataclass
class FuzzedRuntimeStandIn:
    """A host runtime with arbitrary attribute values (a host's own object cannot exist here)."""

    device: Any
    rank: Any
    world_size: Any
    race_jobs: Any
    l2_cache_bytes: Any
    config: Any
    kv_allocator: Any
    tensors: Mapping[str, Any] = field(default_factory=dict)
    process_group: Any = None

    def resident_tensors(self) -> Mapping[str, Any]:
        return self.tensors


class RaisingAllocatorStandIn:
    """A host KV allocator that fails when credited."""

    def add_reclaimed(self, report: object) -> None:
        raise RuntimeError("allocator is full")


any_value = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10), st.text(max_size=8), st.floats(allow_nan=True)
)
windows = st.one_of(st.just("stock"), st.integers(-1, 1 << 28), st.text(max_size=6), st.none())


@pytest.mark.slow  # a property test: 150 examples, each a real start-up
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    device=st.one_of(
        st.sampled_from(["cpu", "cuda:0", "meta", "cpu:5", torch.device("cpu")]), any_value
    ),
    rank=st.one_of(st.integers(-2, 4), any_value),
    world_size=st.one_of(st.integers(-1, 4), any_value),
    race_jobs=st.one_of(st.integers(-3, 9), st.just(10**9), any_value),
    l2=st.one_of(st.sampled_from([MiB, 16 * MiB, 64 * MiB]), st.integers(-1, 1 << 34), any_value),
    window=windows,
    tensor_floats=st.lists(st.integers(0, 48 * MiB // 4), max_size=3),
    allocator=st.sampled_from(["reference", "raising", "none", "no-method"]),
    config_shape=st.sampled_from(["section", "list", "none", "plugins-list"]),
)
def test_the_hook_never_raises_and_never_over_credits(
    device: Any,
    rank: Any,
    world_size: Any,
    race_jobs: Any,
    l2: Any,
    window: Any,
    tensor_floats: list[int],
    allocator: str,
    config_shape: str,
) -> None:
    kv: Any = {
        "reference": ReferenceKVAllocator(1024),
        "raising": RaisingAllocatorStandIn(),
        "none": None,
        "no-method": object(),
    }[allocator]
    config: Any = {
        "section": {"plugins": {"l2evict": {"window": window}}},
        "list": [1, 2],
        "none": None,
        "plugins-list": {"plugins": ["l2evict"]},
    }[config_shape]
    tensors = {f"w{i}": torch.zeros(n) for i, n in enumerate(tensor_floats)}
    runtime = FuzzedRuntimeStandIn(device, rank, world_size, race_jobs, l2, config, kv, tensors)
    try:
        report = hook(runtime)
        installation = installed()
        if report.reclaimed_bytes == 0:
            assert installation is None  # nothing left installed without a credit
        else:
            assert installation is not None
            assert isinstance(race_jobs, int) and isinstance(l2, int)
            assert report.reclaimed_bytes <= race_jobs * stock_buffer_bytes(l2)
            assert eviction_of(installation).read_bytes >= report.window_bytes
        credited = getattr(kv, "reclaimed_bytes", None)
        if credited is not None:
            assert credited == report.reclaimed_bytes
    finally:
        end_any()


def test_a_credit_past_the_free_memory_is_cut_to_it_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 41: on CUDA, the memory free to torch is read once with the basis; a CPU has no
    # such figure, so the device's reading stands in here for one of 100 MiB free.
    import logging

    from support.hosts import CREDIT, complete, runtime

    from flare_l2evict._b12x import proof

    free = 100 * MiB
    monkeypatch.setattr(proof, "device_free_bytes", lambda device: free)
    host = runtime()
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(host)
    assert report.reclaimed_bytes == free == host.kv_allocator.reclaimed_bytes
    assert report.device_free_bytes == free and report.uncut_credit_bytes == CREDIT
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and "CUT from" in line.getMessage()
    audit = complete(host)
    assert audit.credited_bytes == free and audit.uncut_credit_bytes == CREDIT
    assert audit.device_free_bytes == free and "CUT from" in audit.summary()
