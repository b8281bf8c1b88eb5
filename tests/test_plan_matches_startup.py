"""``plan`` on the files promises what start-up does on the same tensors, for random checkpoints.

Real safetensors files, real headers, the real reference host loading them through
safetensors and running the hook through pluggy: the two must credit the same
bytes, or ``plan`` less with its reason; never more.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import save_file
from support.figures import KV_BYTES_PER_TOKEN as KV, MiB

from flare_l2evict.tools._headers import read_checkpoint
from flare_l2evict.tools._inputs import settings_from_config
from flare_l2evict.tools._plan import plan_ranks, shard_of
from flare_l2evict.tools.reference_host import PROFILES, ReferenceHost

pytest.importorskip("b12x.preparation._measurement")

KiB = 1 << 10
names = st.from_regex(r"model\.layers\.[0-9]{1,2}\.(mlp|attn)\.[a-z_]{1,8}", fullmatch=True)
checkpoints = st.dictionaries(
    names,
    st.tuples(
        st.sampled_from([0, 1, 64 * KiB, 256 * KiB, 512 * KiB, 768 * KiB, MiB]),
        st.sampled_from([torch.float32, torch.bfloat16]),
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.slow  # a property test: 60 examples, each a real start-up
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    shapes=checkpoints,
    window_kib=st.sampled_from([1024, 1536, 2048, 3072]),
    exclude=st.sampled_from([[], ["*.attn.*"], ["model.layers.1*"]]),
    race_jobs=st.integers(0, 6),
    enabled=st.sampled_from([True, True, True, False]),
)
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
    config = {"plugins": {"l2evict": {"window": window_kib * KiB, "exclude": exclude}}}
    config["plugins"]["l2evict"]["enabled"] = enabled
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
