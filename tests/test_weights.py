from __future__ import annotations

import pytest
import torch

from flare_l2evict import WeightsError
from flare_l2evict.tools._choose_weights import choose_weights


def test_counts_storages_not_tensors() -> None:
    # Two 60-element views of one 100-element storage beat an 80-element tensor.
    flat = torch.zeros(100)
    tensors = {
        "fused.a": flat[:60],
        "fused.b": flat[40:],
        "single": torch.zeros(80),
    }
    choice = choose_weights(tensors, "cpu", window_bytes=100)
    assert choice.regions[0].nbytes == 400
    assert choice.name == "fused.a"
    assert len(choice.regions) == 1


def test_skips_meta_freed_and_other_devices() -> None:
    freed = torch.zeros(1000)
    freed.untyped_storage().resize_(0)
    tensors = {
        "meta.huge": torch.empty(10**9, device="meta"),
        "freed": freed,
        "empty": torch.empty(0),
        "resident": torch.zeros(64),
    }
    assert choose_weights(tensors, "cpu", window_bytes=128).name == "resident"


def test_host_ram_tensors_do_not_count_for_a_gpu() -> None:
    tensors = {"embed": torch.zeros(1 << 20), "norm": torch.zeros(8)}
    with pytest.raises(WeightsError) as caught:
        choose_weights(tensors, torch.device("cuda", 0), window_bytes=1024)
    message = str(caught.value)
    assert "no storage on cuda:0" in message
    assert "2 other device" in message


def test_exclusion_globs_remove_the_whole_storage() -> None:
    flat = torch.zeros(1000)
    tensors = {
        "model.embed_tokens.weight": flat[:10],  # excluded, and it views the big storage
        "model.layers.0.mlp.w": flat[10:],
        "model.layers.1.mlp.w": torch.zeros(500),
    }
    choice = choose_weights(tensors, "cpu", window_bytes=1000, exclude=["*.embed_tokens.*"])
    assert choice.name == "model.layers.1.mlp.w"
    assert choice.total_bytes == 2000


def test_same_checkpoint_same_choice_ties_go_to_the_first_name() -> None:
    names = [f"model.layers.{i}.w" for i in (3, 1, 2)]
    first = choose_weights({n: torch.zeros(256) for n in names}, "cpu", window_bytes=512)
    second = choose_weights({n: torch.zeros(256) for n in reversed(names)}, "cpu", 512)
    assert first.name == second.name == "model.layers.1.w"


def test_several_storages_largest_first_when_none_covers_the_window() -> None:
    tensors = {
        "a": torch.zeros(100),
        "b": torch.zeros(300),
        "c": torch.zeros(200),
        "d": torch.zeros(1),
    }
    choice = choose_weights(tensors, "cpu", window_bytes=1800)
    assert [s.name for s in choice.regions] == ["b", "c"]
    assert choice.total_bytes == 2000


def test_shortfall_is_reported_with_the_reason() -> None:
    tensors = {"a": torch.zeros(10), "m": torch.empty(5, device="meta")}
    with pytest.raises(WeightsError, match=r"1 eligible storages hold 40 distinct bytes.*1 meta"):
        choose_weights(tensors, "cpu", window_bytes=1 << 20)


def test_no_tensors_names_the_host_fix() -> None:
    with pytest.raises(WeightsError, match="no resident checkpoint tensors"):
        choose_weights({}, "cpu", window_bytes=64)


def test_a_non_tensor_is_named() -> None:
    with pytest.raises(WeightsError, match="'scale' is a float"):
        choose_weights({"w": torch.zeros(8), "scale": 0.5}, "cpu", 16)  # type: ignore[dict-item]
