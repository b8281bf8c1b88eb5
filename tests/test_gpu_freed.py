"""On a real GPU: the host frees its weights after the hook, hands the memory back with
``torch.cuda.empty_cache()`` and puts a "KV cache" there; the races must not read it.

Before the per-read check (issue 21), a freed storage slice was read at its old
address: the new tensor placed there, or, after ``empty_cache()``, an illegal
memory access that ended the process. Each case runs ``tests/support/freed_memory.py``
in a process of its own on ``cuda:0`` (real b12x seam, real plugin, real torch),
which allocates the KV tensor over the freed memory, runs the evictions, checks
the KV tensor is untouched and the device still runs work, and prints its
report and audit. Marker ``gpu``: skipped without CUDA.

    python -m pytest -m gpu tests/test_gpu_freed.py -v
"""

from __future__ import annotations

import pytest
import torch
from support.freed_memory import FREED, freed

pytestmark = pytest.mark.gpu

# share_memory_() moves a CPU storage into shared memory; on CUDA torch makes it a no-op.
MOVED_ON_CUDA = [kind for kind in FREED if kind != "slice-share"]
DURING_RACES = ["between-races", "concurrent"]


@pytest.fixture(autouse=True)
def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def test_weights_kept_in_place_are_read_on_the_gpu() -> None:
    got = freed("none", "cuda:0")
    print(got)
    assert got["healthy"] and got["credited"] and got["fallback_reason"] is None


@pytest.mark.parametrize("kind", MOVED_ON_CUDA)
def test_freed_weights_and_empty_cache_leave_the_process_healthy(kind: str) -> None:
    got = freed(kind, "cuda:0")
    print(got)
    assert got["healthy"], got
    assert got["credited"], got
    assert got["eviction_warnings"] == 1 and got["fallback_reason"], got
    assert got["shortfall_bytes"] and got["audit_warns"], got  # the stock buffer made instead


def test_share_memory_is_a_no_op_on_cuda_and_the_reads_go_on() -> None:
    got = freed("slice-share", "cuda:0")
    print(got)
    assert got["healthy"] and got["credited"] and got["fallback_reason"] is None, got


def test_slices_without_their_owner_are_refused_on_the_gpu() -> None:
    got = freed("slice-alone", "cuda:0")
    print(got)
    assert got["healthy"] and got["credited"] == 0, got
    assert "2 borrowed" in str(got["reason"]), got


@pytest.mark.parametrize("kind", DURING_RACES)
def test_a_free_during_the_races_leaves_the_process_healthy(kind: str) -> None:
    # Issue 28: freed on the race thread between races (empty_cache after it), or from
    # another thread while 60 evictions run (no empty_cache): healthy, with the audit.
    got = freed(kind, "cuda:0")
    print(got)
    assert got["healthy"] and got["credited"], got
    if kind == "between-races":  # the next read's check sees it: one line, the shortfall
        assert got["eviction_warnings"] == 1 and got["fallback_reason"], got
        assert got["shortfall_bytes"] and got["audit_warns"], got
    else:  # seen before some read, or never (every read came first): never over-credited
        assert got["eviction_warnings"] <= 1, got
        assert bool(got["fallback_reason"]) == bool(got["shortfall_bytes"]), got
