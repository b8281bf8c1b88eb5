"""``plan`` on the files promises what start-up does on the same tensors, for random checkpoints.

Real safetensors files, real headers, the real reference host loading them through
safetensors and running the hook through pluggy: the two must credit the same
bytes, or ``plan`` less with its reason; never more.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, strategies as st
from safetensors.torch import save_file
from support.checkpoints import SECTION, SIZES, names, property_test, section
from support.figures import KV_BYTES_PER_TOKEN as KV

from flare_l2evict.tools._headers import read_checkpoint
from flare_l2evict.tools._inputs import settings_from_config
from flare_l2evict.tools._plan import plan_ranks, shard_of
from flare_l2evict.tools.reference_host import PROFILES, ReferenceHost

pytest.importorskip("b12x.preparation._measurement")

checkpoints = st.dictionaries(
    names,
    st.tuples(st.sampled_from(SIZES), st.sampled_from([torch.float32, torch.bfloat16])),
    min_size=1,
    max_size=6,
)


@pytest.mark.slow  # a property test: 60 examples, each a real start-up
@property_test(60)
@given(shapes=checkpoints, **SECTION)
def test_plan_credits_what_startup_credits_never_more(
    tmp_path_factory: pytest.TempPathFactory,
    shapes: dict[str, tuple[int, torch.dtype]],
    window_kib: int,
    exclude: list[str],
    race_jobs: int,
    enabled: bool,
) -> None:
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_file({name: torch.ones(n, dtype=dtype) for name, (n, dtype) in shapes.items()}, str(path))
    config = section(window_kib, exclude, enabled)
    profile = dataclasses.replace(PROFILES["h100"], race_jobs=race_jobs)

    (rank,) = plan_ranks(
        [shard_of(read_checkpoint([path]))],
        settings_from_config(config),
        l2_cache_bytes=profile.l2_cache_bytes,
        race_jobs=race_jobs,
        kv_bytes_per_token=KV,
    )
    host = ReferenceHost(plugins=["l2evict"], config=config, profile=profile, kv_bytes_per_token=KV)
    report = host.start(path).report
    assert report is not None

    assert rank.reclaimed_bytes <= report.reclaimed_bytes
    if rank.reclaimed_bytes < report.reclaimed_bytes:
        assert rank.reason  # plan lower only with its reason
    else:
        assert rank.reclaimed_bytes == report.reclaimed_bytes
    if report.reclaimed_bytes:
        assert rank.tensor == report.source_tensor
        assert list(rank.sources) == [s.tensor for s in report.sources]
    else:
        assert rank.reclaimed_bytes == 0 and rank.reason and report.reason
