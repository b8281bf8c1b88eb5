"""On a real GPU: hosts that start up under inference mode, and storages that overlap in memory.

Marker ``gpu``: skipped without CUDA. The host's runtime is the reference host's;
b12x's seam, pluggy and torch are real.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from support.figures import OWN, MiB
from support.hosts import JOBS, complete, hook, runtime
from support.startups import end_any, installed
from support.sums import checksum

import flare_l2evict
import flare_l2evict._eviction
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict.tools.reference_host import ReferenceRuntime

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device() -> torch.device:
    return torch.device("cuda", 0)


@pytest.fixture
def measurement() -> object:
    return pytest.importorskip("b12x.preparation._measurement")


@pytest.fixture(autouse=True)
def _finished() -> Iterator[None]:
    yield
    end_any()
    torch.cuda.empty_cache()


def runtime_for(tensors: dict[str, torch.Tensor], device: torch.device) -> ReferenceRuntime:
    """The shared host on ``device``, whose L2 size the plugin reads from the device."""
    return runtime(tensors=tensors, device=device, l2_cache_bytes=None)


def run_triton_once(device: torch.device) -> None:
    """What a host that already runs Triton kernels has done before the hook."""
    import triton
    import triton.language as tl

    @triton.jit
    def host_kernel(x):  # type: ignore[no-untyped-def]
        tl.store(x + tl.arange(0, 16), tl.arange(0, 16).to(tl.float32))

    out = torch.empty(16, device=device)
    host_kernel[(1,)](out)
    torch.cuda.synchronize(device)


@pytest.mark.parametrize("host_runs_triton", [False, True], ids=["torch-read", "triton-read"])
def test_a_host_under_inference_mode_races_outside_it(
    device: torch.device,
    measurement: object,
    host_runs_triton: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if host_runs_triton:
        pytest.importorskip("triton")
        run_triton_once(device)
    else:
        # A host that runs no Triton; this pytest process has, through earlier GPU tests.
        monkeypatch.setattr(flare_l2evict._eviction, "triton_started", lambda: False)
    with torch.inference_mode():
        tensors = {
            "model.layers.0.mlp.experts.w13_weight": torch.ones(512 * MiB // 4, device=device)
        }
        host = runtime_for(tensors, device)
        report = hook(host)
    expected = "triton" if host_runs_triton else "torch"
    print(f"inference-mode host: {report.summary()}")
    assert report.reclaimed_bytes > 0 and report.read_kernel == expected
    handle = measurement._l2_flush_fn(device, enabled=True)  # type: ignore[attr-defined]
    assert isinstance(handle, EvictionHandle)
    for _ in range(3):
        handle()  # outside inference mode, as b12x's races run
    torch.cuda.synchronize(device)
    assert checksum(handle.eviction) == pytest.approx(report.window_bytes / 4, rel=1e-5)


def test_tensors_over_one_cuda_allocation_count_once(
    device: torch.device, caplog: pytest.LogCaptureFixture
) -> None:
    l2 = int(torch.cuda.get_device_properties(device).L2_cache_size)
    window = -(-max(2 * l2, 64 * MiB) // 4) * 4
    block = torch.ones(window // 4 + 4096, device=device).untyped_storage()
    nbytes = block.nbytes()
    # Storage slices borrow the block's memory and are never read themselves (issue 21);
    # the block's own tensor, resident too, covers the same bytes.
    aliases = {
        f"alias.{i}": torch.empty(0, device=device).set_(block[0:nbytes], 0, (nbytes // 4,), (1,))
        for i in range(16)
    }
    aliases["owner"] = torch.empty(0, device=device).set_(block)
    host = runtime_for(aliases, device)
    report = hook(host)
    # One allocation covers the window once: credited, with one region read once.
    assert report.reclaimed_bytes == JOBS * report.stock_buffer_bytes - OWN
    (region,) = report.sources
    assert region.storage_bytes == nbytes and region.read_bytes == window
    held = [measurement_seam(device) for _ in range(host.race_jobs)]
    for handle in held:
        handle()
    torch.cuda.synchronize(device)
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        audit = complete(host)
    print(f"audit: {audit.summary()}")
    assert audit.peak_alive == host.race_jobs and audit.unused_credit_bytes == 0
    end_any()
    # Half the window over sixteen aliases of one allocation is not a window.
    half = torch.ones(window // 8, device=device).untyped_storage()
    short = {
        f"alias.{i}": torch.empty(0, device=device).set_(half[0 : half.nbytes()]) for i in range(16)
    }
    short["owner"] = torch.empty(0, device=device).set_(half)
    report = hook(runtime_for(short, device))
    print(f"16 aliases of {half.nbytes():,} bytes: {report.summary()}")
    assert report.reclaimed_bytes == 0 and "1 eligible storage holds" in (report.reason or "")
    assert installed() is None


def measurement_seam(device: torch.device) -> EvictionHandle:
    module = pytest.importorskip("b12x.preparation._measurement")
    handle = module._l2_flush_fn(device, enabled=True)
    assert isinstance(handle, EvictionHandle)
    return handle


def test_a_storage_off_a_word_boundary_is_skipped_not_faulted(device: torch.device) -> None:
    l2 = int(torch.cuda.get_device_properties(device).L2_cache_size)
    window = -(-max(2 * l2, 64 * MiB) // 4) * 4
    raw = torch.ones(window + 4096, dtype=torch.uint8, device=device).untyped_storage()
    skewed = torch.empty(0, dtype=torch.uint8, device=device).set_(raw[1 : raw.nbytes()])
    report = hook(runtime_for({"skewed": skewed}, device))
    print(f"a storage at an odd address: {report.summary()}")
    # A storage can only sit off a word boundary by borrowing memory (a slice): it is
    # refused as borrowed before its address is even asked.
    assert report.reclaimed_bytes == 0 and "1 borrowed" in (report.reason or "")


def _free_to_torch(device: torch.device) -> int:
    """What is free to torch on ``device`` now: the driver's free plus torch's unused cache."""
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(torch.cuda.mem_get_info(device)[0]) + unused


def test_the_credit_never_exceeds_the_memory_free_on_the_device(device: torch.device) -> None:
    # Issue 41: the most race jobs there can be, each credited a stock buffer, on a device
    # with little free memory left (the host's other memory holds the rest): the credit is
    # cut to what was free when the hook ran, on any card.
    from flare_l2evict._request import MAX_RACE_JOBS

    tensors = {"model.layers.0.mlp.experts.w13_weight": torch.ones(512 * MiB // 4, device=device)}
    ballast = torch.empty(_free_to_torch(device) - 2048 * MiB, dtype=torch.uint8, device=device)
    before = _free_to_torch(device)
    host = runtime(tensors=tensors, device=device, l2_cache_bytes=None, race_jobs=MAX_RACE_JOBS)
    report = hook(host)
    print(f"little free memory: {report.summary()}")
    free = report.device_free_bytes
    # Read once, when the hook ran: what the test saw just before, less what the hook's own
    # first CUDA work took (a driver page of slack for the allocator's rounding).
    assert free is not None and 0 < free <= before + 2 * MiB
    assert report.reclaimed_bytes == free == host.kv_allocator.reclaimed_bytes  # cut to it
    assert report.uncut_credit_bytes == MAX_RACE_JOBS * report.stock_buffer_bytes - OWN
    audit = complete(host)
    assert audit.credited_bytes == report.reclaimed_bytes
    assert audit.device_free_bytes == free and audit.uncut_credit_bytes == report.uncut_credit_bytes
    del ballast
