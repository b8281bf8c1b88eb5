"""On a real GPU: b12x's real races run through ``flare_l2evict.evicting_from``.

Marker ``gpu``: skipped without CUDA. The races are b12x's own
(``prepare_race_steps``/``measure_race_steps``, which ask the seam for their
eviction themselves), run by the reference host's race runner under b12x's
real ``no_compilation()`` guard; where the CuTe DSL is not installed only
``b12x._lib.compiler`` is stood in (``cute_guard``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from support.figures import MiB
from support.gpu_memory import settled
from support.startups import end_any

import flare_l2evict
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict.tools._origin import stock_row
from flare_l2evict.tools.reference_host import RaceResult

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _finished() -> Iterator[None]:
    yield
    end_any()
    torch.cuda.empty_cache()


def test_b12x_real_races_read_the_named_tensors_instead_of_a_buffer() -> None:
    from flare_l2evict.tools.reference_host import cute_guard, gemm_candidates, run_race

    row = stock_row()
    measurement = pytest.importorskip(row.module_path)
    stock = getattr(measurement, row.function)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    calls = gemm_candidates(device)
    for call in calls:
        call.run()  # cuBLAS warmed outside the race: b12x's stream gate waits on none of it
    torch.cuda.synchronize(device)

    def race() -> tuple[int, RaceResult]:
        """One race where b12x makes its own eviction; the allocator's peak growth during it."""
        settled(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with cute_guard():
            result = run_race(calls, device, None)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base, result

    stock_peak, stock_result = race()
    weights = {"model.layers.0.mlp.experts.w13_weight": torch.ones(512 * MiB // 4, device=device)}
    with flare_l2evict.evicting_from(weights, race_jobs=1) as report:
        print(f"evicting_from: {report.summary()}")
        assert report.reclaimed_bytes > 0, report.reason
        assert isinstance(getattr(measurement, row.function)(device, enabled=True), EvictionHandle)
        plugin_peak, plugin_result = race()
    print(
        f"race peak growth: stock {stock_peak:,} B, through evicting_from {plugin_peak:,} B; "
        f"stock buffer {report.stock_buffer_bytes:,} B; latencies (us) stock "
        f"{stock_result.latencies_us}, evicting_from {plugin_result.latencies_us}"
    )
    assert getattr(measurement, row.function) is stock  # stock b12x back on exit
    assert len(plugin_result.latencies_us) == len(stock_result.latencies_us) == len(calls)
    assert all(latency > 0 for latency in plugin_result.latencies_us)
    # The race made no eviction buffer of its own: its peak is a stock buffer lower.
    assert stock_peak - plugin_peak >= report.stock_buffer_bytes - MiB
