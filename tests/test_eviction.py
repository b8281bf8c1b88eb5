"""The eviction itself: what one call reads and writes, and what it does when memory goes away.

Case -> outcome (memory that goes away under the eviction):

- the host frees, resizes, moves, re-sets, swaps or offloads its weights after
  the hook -> no crash, no read of freed memory; one WARNING, stock from then
  on, and the audit names the fallback and the shortfall (a process per case;
  on a GPU, through ``empty_cache()``: ``test_gpu_freed.py``);
- the per-read check -> runs no host code (no ``__torch_function__``), and
  still sees a freed storage.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.figures import MiB
from support.freed_memory import FREED, freed
from support.sums import checksum
from torch.autograd.profiler import profile

from flare_l2evict._eviction import WeightEviction
from flare_l2evict.tools._choose_weights import choose_weights


def digest(tensor: torch.Tensor) -> str:
    # A copy: .numpy() marks the storage it shares non-resizable, which the choice refuses.
    return hashlib.sha256(tensor.clone().view(torch.uint8).numpy().tobytes()).hexdigest()


def test_reads_the_tail_of_the_storage_and_writes_nothing() -> None:
    weights = torch.arange(1000, dtype=torch.float32)
    before = digest(weights)
    eviction = WeightEviction(choose_weights({"w": weights}, "cpu", window_bytes=400))
    eviction()
    assert eviction.read_bytes == 400
    assert checksum(eviction) == sum(range(900, 1000))  # the last 100 floats
    assert digest(weights) == before


def test_reads_several_storages_to_cover_the_window() -> None:
    tensors = {"big": torch.ones(100), "small": torch.full((60,), 2.0)}
    eviction = WeightEviction(choose_weights(tensors, "cpu", window_bytes=600))
    assert eviction.read_bytes == 600
    assert len(eviction._views) == 2
    eviction()
    # The last view read is 50 elements of "small" (2.0 each).
    assert checksum(eviction) == 100.0


def test_a_call_allocates_nothing_on_the_host_side() -> None:
    weights = torch.full((1 << 14,), 2.0)  # 64 KiB, the whole window
    eviction = WeightEviction(choose_weights({"w": weights}, "cpu", window_bytes=1 << 16))
    outputs = (eviction._partial.data_ptr(), eviction._out.data_ptr())
    with profile(profile_memory=True) as calls:  # records each host allocation
        for _ in range(3):
            eviction()
    assert [e.name for e in calls.function_events if e.cpu_memory_usage > 0] == []
    # The reads land in the outputs made with the eviction, not in new ones.
    assert (eviction._partial.data_ptr(), eviction._out.data_ptr()) == outputs
    assert checksum(eviction) == 2.0 * (1 << 14)
    # The profiler does see a host allocation of this size: the check above can fail.
    with profile(profile_memory=True) as allocating:
        torch.sum(weights)
    assert any(e.cpu_memory_usage > 0 for e in allocating.function_events)


def test_a_freed_storage_falls_back_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    weights = torch.zeros(1024)
    calls: list[str] = []

    def stock_factory_stand_in() -> Callable[[], None]:
        calls.append("made")
        return lambda: calls.append("stock")

    eviction = WeightEviction(
        choose_weights({"w": weights}, "cpu", window_bytes=4096), fallback=stock_factory_stand_in
    )
    weights.untyped_storage().resize_(0)
    with caplog.at_level(logging.WARNING, logger="flare_l2evict"):
        eviction()
        eviction()
    assert calls == ["made", "stock", "stock"]
    assert eviction.released
    assert len([r for r in caplog.records if "falls back" in r.message]) == 1


def test_a_holder_count_that_raises_falls_back_instead_of_failing_the_race(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # torch's C++ use count cannot be made to fail here: a stand-in raises in its place.
    weights = torch.zeros(1024)
    stock: list[str] = []
    eviction = WeightEviction(
        choose_weights({"w": weights}, "cpu", window_bytes=4096),
        fallback=lambda: lambda: stock.append("stock"),
    )

    def use_count_stand_in(cdata: int) -> int:
        raise RuntimeError("use count unavailable")

    monkeypatch.setattr("flare_l2evict._eviction._use_count", use_count_stand_in)
    with caplog.at_level(logging.WARNING, logger="flare_l2evict"):
        eviction()
        eviction()
    assert stock == ["stock", "stock"] and eviction.released
    assert "RuntimeError: use count unavailable" in (eviction.fell_back_reason or "")
    assert len([r for r in caplog.records if "falls back" in r.message]) == 1


def test_release_drops_the_weights() -> None:
    from torch.multiprocessing.reductions import StorageWeakRef

    weights = torch.zeros(4096)
    ref = StorageWeakRef(weights.untyped_storage())  # type: ignore[no-untyped-call]
    eviction = WeightEviction(choose_weights({"w": weights}, "cpu", window_bytes=1024))
    del weights
    assert not ref.expired()  # type: ignore[no-untyped-call]  # the eviction keeps it alive while installed
    eviction.release()
    assert ref.expired()  # type: ignore[no-untyped-call]


# Memory that goes away under the eviction (a process per case).
@pytest.mark.slow  # a fresh interpreter that imports torch, forked per kind
def test_weights_kept_in_place_are_read_to_the_end() -> None:
    got = freed("none")
    assert got["credited"] and got["fallback_reason"] is None and got["eviction_warnings"] == 0
    assert not got["audit_warns"]


@pytest.mark.slow  # the same fresh interpreter's kinds
@pytest.mark.parametrize("kind", FREED)
def test_weights_freed_after_the_hook_fall_back_with_one_warning(kind: str) -> None:
    got = freed(kind)
    assert got["credited"], got  # the hook saw intact weights
    assert got["eviction_warnings"] == 1, got
    reason = str(got["fallback_reason"])
    expected = {"set": "no longer views", "swap": "no longer views", "offload": "no longer views"}
    expected["dropped"] = "nothing but the plugin holds"
    assert expected.get(kind, "freed, resized or") in reason, got
    assert got["shortfall_bytes"] and got["audit_warns"], got
    assert "FELL BACK" in str(got["audit"]) and "SHORTFALL" in str(got["audit"])


class CountingTensorStandIn(torch.Tensor):
    """A host's tensor subclass whose ``__torch_function__`` is host code (counted)."""

    calls = 0

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: Any = (),
        kwargs: Any = None,
    ) -> Any:
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]


def test_the_per_read_check_runs_no_host_code_and_still_sees_a_freed_storage() -> None:
    weights = torch.ones(MiB // 4).as_subclass(CountingTensorStandIn)
    eviction = WeightEviction(choose_weights({"w": weights}, "cpu", MiB // 2))
    before = CountingTensorStandIn.calls
    for _ in range(10):
        eviction()
    assert CountingTensorStandIn.calls == before and eviction.fell_back_reason is None
    torch.Tensor.untyped_storage(weights).resize_(0)
    eviction()
    assert "freed, resized or moved" in str(eviction.fell_back_reason)
