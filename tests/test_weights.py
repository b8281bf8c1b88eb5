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


# Issue 28, "unbounded": the names a host's mapping yields are bounded in characters as well.
def test_endless_long_names_are_refused_on_their_characters_in_bounded_memory() -> None:
    import itertools
    from collections.abc import Iterator, Mapping

    from flare_l2evict._weights import MAX_NAME_CHARS, storages_of

    one = torch.zeros(1)
    yielded = [0]

    class EndlessLongNamesStandIn(Mapping[str, torch.Tensor]):
        def __getitem__(self, key: str) -> torch.Tensor:
            return one

        def __iter__(self) -> Iterator[str]:
            for i in itertools.count():
                yielded[0] += 1000
                if yielded[0] > 4 * MAX_NAME_CHARS:  # far past the limit: main's behaviour
                    return
                yield f"{i:08d}" + "n" * 992

        def __len__(self) -> int:
            return 1 << 62

    with pytest.raises(WeightsError) as raised:
        storages_of(EndlessLongNamesStandIn(), torch.device("cpu"))
    line = str(raised.value)
    assert "\n" not in line and f"more than {MAX_NAME_CHARS:,} characters" in line, line
    assert "fix: the host must return this rank's checkpoint tensors" in line
    # Read at most one chunk of 1,024 names past the limit.
    assert yielded[0] <= MAX_NAME_CHARS + 1024 * 1000


def test_names_under_the_limits_are_read_whole_in_order() -> None:
    from flare_l2evict._weights import storages_of

    tensors = {f"w{i}": torch.zeros(4) for i in range(3000)}  # three chunks of names
    found, _ = storages_of(tensors, torch.device("cpu"))
    assert list(found.names) == list(tensors)


def test_a_name_that_is_no_str_after_the_first_chunk_is_named() -> None:
    from flare_l2evict._weights import storages_of

    tensors: dict[object, torch.Tensor] = {f"w{i}": torch.zeros(4) for i in range(1500)}
    tensors[7] = torch.zeros(4)
    with pytest.raises(WeightsError, match="resident tensor name 7 has type int, not str"):
        storages_of(tensors, torch.device("cpu"))  # type: ignore[arg-type]


# Issue 28, "wrong words": memory mapped from a file is named as an mmap, not a slice or DLPack.
def test_weights_mapped_from_a_file_are_named_as_an_mmap(tmp_path: object) -> None:
    from pathlib import Path

    from flare_l2evict._decision import choose_regions
    from flare_l2evict._weights import storages_of

    path = Path(str(tmp_path)) / "w.pt"
    torch.save({"layers.0.w": torch.ones(1 << 18), "layers.1.w": torch.ones(1 << 18)}, path)
    mapped = torch.load(path, mmap=True)
    assert not mapped["layers.0.w"].untyped_storage().resizable()
    found, _ = storages_of(mapped, torch.device("cpu"))
    reason = choose_regions(found, 1 << 20).shortfall or ""
    assert "2 file-mapped" in reason and "borrowed" not in reason, reason
    assert "mapped from a file, an mmap: torch.load(mmap=True)" in reason, reason
    assert "'layers.0.w', 'layers.1.w'" in reason and "slice base[a:b]" not in reason, reason
    assert "fix: load the weights into memory torch allocates" in reason, reason


def test_more_names_than_the_limit_is_one_line() -> None:
    # The limit is where the hook's worst case stays under 10 s (BENCHMARKS.md).
    from collections.abc import Iterator, Mapping

    from flare_l2evict._weights import MAX_TENSORS, storages_of

    one = torch.zeros(1)

    class OneTooManyStandIn(Mapping[str, torch.Tensor]):
        def __getitem__(self, key: str) -> torch.Tensor:
            return one

        def __iter__(self) -> Iterator[str]:
            return (f"t{i}" for i in range(MAX_TENSORS + 1))

        def __len__(self) -> int:
            return MAX_TENSORS + 1

    assert MAX_TENSORS <= 250_000
    with pytest.raises(WeightsError) as raised:
        storages_of(OneTooManyStandIn(), torch.device("cpu"))
    line = str(raised.value)
    assert "\n" not in line and f"more than {MAX_TENSORS:,} names; fix: " in line


def test_the_info_line_names_mapped_weights_apart_from_borrowed_ones(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    from pathlib import Path

    from flare_l2evict._decision import choose_regions
    from flare_l2evict._weights import storages_of, weight_choice

    path = Path(str(tmp_path)) / "w.pt"
    torch.save({"mapped.w": torch.ones(1 << 18)}, path)
    tensors = {
        **torch.load(path, mmap=True),
        "slice.w": torch.empty(0).set_(torch.ones(1 << 18).untyped_storage()[0 : 1 << 20]),
        "owned.w": torch.ones(1 << 18),
    }
    cpu = torch.device("cpu")
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        found, held = storages_of(tensors, cpu)
        choice = weight_choice(choose_regions(found, 1 << 20), held, cpu)
    assert [region.name for region in choice.regions] == ["owned.w"]
    lines = [r.getMessage() for r in caplog.records if "borrows memory" in r.getMessage()]
    (mapped,) = [line for line in lines if "mapped from a file" in line]
    (sliced,) = [line for line in lines if "slice base[a:b]" in line]
    assert "'mapped.w'" in mapped and "'slice.w'" not in mapped
    assert "'slice.w'" in sliced and "'mapped.w'" not in sliced
