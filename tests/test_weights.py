"""The weights the eviction reads: which storages count, whose they are, and how they are named.

Case -> outcome (the host's own tensors, through the real hook):

- a tensor subclass whose ``__torch_function__`` answers ``untyped_storage()``
  with memory only the plugin would hold -> its own storage is what counts
  (64 bytes: nothing credited);
- ``resident_tensors()`` returning fresh copies (``W.contiguous()`` of a
  non-contiguous weight), or copies kept only by a reference cycle -> credit 0,
  one line: nothing but the plugin would hold them; weights the host drops after
  the hook -> stock from the next read, with the reason in the audit;
- weights the host holds only by its fused storage object, or by fresh aliases
  (``p.data``) -> the host's: credited and read to the end;
- a host mode that records every op output while the hook runs (any dispatch or
  function mode), flushed after it -> the host's ``nn.Parameter`` is still the
  host's: no fallback mid-start-up;
- an object whose ``__class__`` claims ``torch.Tensor`` with an endless shape,
  ``dict.values()``, a Mapping whose ``items()`` blocks -> named by type at once;
- slices with no resident owner, DLPack imports, ``frombuffer``, a numpy export
  -> never read, one line naming them (borrowed); with the owner resident, the
  owner is read.

The host's runtime and allocator are stand-ins (named so); pluggy, the plugin,
b12x's real seam and torch are real.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
import torch.utils.dlpack
from support.figures import MiB
from support.freed_memory import freed
from support.hosts import complete, hook, runtime
from support.startups import eviction_of, installed
from support.sums import total_bytes
from torch.utils._python_dispatch import TorchDispatchMode

from flare_l2evict import WeightsError
from flare_l2evict._decision import choose_regions
from flare_l2evict._text import described_value
from flare_l2evict._weights import storages_of, weight_choice
from flare_l2evict.tools._choose_weights import choose_weights
from flare_l2evict.tools._origin import stock_row
from flare_l2evict.tools.reference_host import ReferenceRuntime

measurement = pytest.importorskip(stock_row().module_path)


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
    assert total_bytes(choice) == 2000


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
    assert total_bytes(choice) == 2000


def test_shortfall_is_reported_with_the_reason() -> None:
    tensors = {"a": torch.zeros(10), "m": torch.empty(5, device="meta")}
    with pytest.raises(WeightsError, match=r"1 eligible storage holds 40 distinct bytes.*1 meta"):
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
    from collections.abc import Mapping

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
    from collections.abc import Mapping

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


# The host's own tensors: what the host holds is credited, what only the plugin would hold is not.
class LazyStorageTensorStandIn(torch.Tensor):
    """A host tensor subclass that builds a fresh 128 MiB storage whenever asked for one."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.untyped_storage:
            return torch.zeros(128 * MiB // 4).untyped_storage()
        return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]


def test_a_subclass_cannot_answer_for_its_storage() -> None:
    lazy = torch.zeros(16).as_subclass(LazyStorageTensorStandIn)  # 64 bytes really held
    host = runtime(tensors={"w": lazy})
    report = hook(host)
    assert report.reclaimed_bytes == 0 and host.kv_allocator.reclaimed_bytes == 0
    assert "64 distinct bytes" in (report.reason or "")


class CopyingRuntimeStandIn(ReferenceRuntime):
    """A host whose ``resident_tensors()`` returns a fresh copy of each weight, every call."""

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        return {name: t.contiguous() for name, t in self.tensors.items()}


def test_fresh_copies_from_resident_tensors_are_not_credited() -> None:
    weight = torch.zeros(128 * MiB // 4).view(-1, 1024).t()  # non-contiguous: .contiguous() copies
    host = runtime(tensors={"w": weight}, kind=CopyingRuntimeStandIn)
    report = hook(host)
    assert report.reclaimed_bytes == 0 and host.kv_allocator.reclaimed_bytes == 0
    assert (report.reason or "").startswith("nothing but the plugin holds the storage of 'w'")
    assert "fix: resident_tensors() must return the tensors" in (report.reason or "")
    assert installed() is None
    assert getattr(measurement, stock_row().function).__module__ == measurement.__name__


def test_the_hosts_own_tensors_are_credited_and_dropping_them_later_falls_back() -> None:
    weights = {"w": torch.zeros(128 * MiB // 4)}
    host = runtime(tensors=weights)
    report = hook(host)
    assert report.reclaimed_bytes > 0  # held by the host: credited as before
    startup = installed()
    assert startup is not None
    eviction = eviction_of(startup)
    eviction()  # reads the weights
    weights.clear()  # the host drops them: only the plugin would keep them alive
    eviction()
    audit = complete(host)
    assert audit.fallback_reason is not None
    assert audit.fallback_reason.startswith("nothing but the plugin holds the storage of 'w'")


@pytest.mark.parametrize("kept", ["storage-object", "aliases"])
def test_weights_the_host_holds_by_other_handles_are_still_the_hosts(kept: str) -> None:
    # A host that keeps only its fused base storage object (vLLM-style fused buffers), or
    # hands out fresh aliases (p.data) of tensors it keeps: held, so credited and read.
    base = torch.zeros(128 * MiB // 4)
    storage = base.untyped_storage()
    model = {"w": base}
    tensors = {"w": torch.empty(0).set_(storage)} if kept == "storage-object" else {}
    host = runtime(tensors=tensors)
    if kept == "aliases":
        host.tensors = {"w": model["w"].data}  # a new alias each time the host builds it
    report = hook(host)
    assert report.reclaimed_bytes > 0, report.reason
    host.tensors = {}
    del tensors, base
    if kept == "storage-object":
        model.clear()  # only the storage object is left to the host
    startup = installed()
    assert startup is not None
    eviction_of(startup)()
    audit = complete(host)
    assert audit.fallback_reason is None and audit.shortfall_bytes == 0, audit.summary()
    assert storage.nbytes() == 128 * MiB


class RecordingModeStandIn(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A host's debug recorder: keeps every op output made while it is active."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: list[object] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.seen.append(out)
        return out


def test_a_mode_that_recorded_the_hooks_ops_does_not_make_the_hosts_weights_look_dropped() -> None:
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(128 * MiB // 4), requires_grad=False)
    host = runtime(tensors={})
    host.tensors = dict(model.named_parameters())
    recorder = RecordingModeStandIn()
    with recorder:
        report = hook(host)
    assert recorder.seen  # it saw the plugin's own ops (its views) while the hook ran
    recorder.seen.clear()  # the recorder is flushed; the model keeps its parameter
    host.tensors = {}
    startup = installed()
    assert report.reclaimed_bytes > 0 and startup is not None, report.reason
    eviction_of(startup)()
    audit = complete(host)
    assert audit.fallback_reason is None and audit.shortfall_bytes == 0, audit.summary()


class CopyingInACycleRuntimeStandIn(ReferenceRuntime):
    """A host whose copies are kept alive only by a reference cycle it drops at once."""

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        copy = self.tensors["w"].contiguous()
        cycle: list[object] = [copy]
        cycle.append(cycle)
        return {"w": copy}


def test_a_copy_kept_only_by_a_reference_cycle_is_not_credited() -> None:
    weight = torch.zeros(128 * MiB // 4).view(-1, 1024).t()
    host = runtime(tensors={"w": weight}, kind=CopyingInACycleRuntimeStandIn)
    report = hook(host)
    assert report.reclaimed_bytes == 0 and host.kv_allocator.reclaimed_bytes == 0
    assert (report.reason or "").startswith("nothing but the plugin holds the storage of 'w'")


class LyingTensorStandIn:
    """A host object whose ``__class__`` claims ``torch.Tensor`` and whose shape never ends."""

    __class__ = property(lambda self: torch.Tensor)
    shape = itertools.count()


class BlockingMappingStandIn(Mapping[str, object]):
    """A host mapping whose iteration must never be asked for in a message (fails the test)."""

    def __getitem__(self, key: str) -> object:
        raise AssertionError("read")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("iterated")

    def __len__(self) -> int:
        raise AssertionError("sized")


@pytest.mark.parametrize(
    "value",
    [LyingTensorStandIn(), {"w": torch.zeros(4)}.values(), BlockingMappingStandIn()],
    ids=["lying-class", "dict-values", "blocking-mapping"],
)
def test_odd_values_are_named_by_their_type(value: object) -> None:
    text = described_value(value, 80)
    assert text == f"<a {type(value).__name__}>"
    host = runtime(tensors={})
    host.tensors = value  # type: ignore[assignment]
    report = hook(host)
    assert report.reclaimed_bytes == 0 and "\n" not in (report.reason or "")


# Borrowed memory: storages that do not own their memory are never read.
@pytest.mark.slow  # support/freed_memory.py's fresh interpreter
def test_slices_without_their_owner_are_refused_by_name() -> None:
    got = freed("slice-alone")
    assert got["credited"] == 0
    reason = str(got["reason"])
    assert "2 borrowed" in reason and "'layers.0.w', 'layers.1.w'" in reason
    assert "fix: include a tensor over the owning storage" in reason


def test_borrowed_storages_are_never_read_and_one_line_names_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owned = torch.ones(MiB // 4)
    tensors = {
        "dlpack": torch.utils.dlpack.from_dlpack(torch.ones(4 * MiB // 4)),
        "buffer": torch.frombuffer(bytearray(4 * MiB), dtype=torch.float32),
        "slice": torch.empty(0).set_(torch.ones(4 * MiB // 4).untyped_storage()[0 : 4 * MiB]),
        "owned": owned,
    }
    for name in ("dlpack", "buffer", "slice"):
        assert not tensors[name].untyped_storage().resizable()
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        found, held = storages_of(tensors, torch.device("cpu"))
        choice = weight_choice(choose_regions(found, MiB), held, torch.device("cpu"))
    assert [s.name for s in choice.regions] == ["owned"]
    (line,) = [r.getMessage() for r in caplog.records if "borrows memory" in r.getMessage()]
    assert "3 resident tensors" in line and "'buffer', 'dlpack', 'slice'" in line
    with pytest.raises(WeightsError, match=r"3 borrowed.*'dlpack', 'buffer', 'slice'"):
        choose_weights(tensors, "cpu", 2 * MiB)


def test_a_slice_is_covered_by_its_resident_owner() -> None:
    base = torch.arange(MiB // 4, dtype=torch.float32).untyped_storage()
    tensors = {
        "layer": torch.empty(0).set_(base[0 : MiB // 2], 0, (MiB // 8,), (1,)),
        "owner": torch.empty(0).set_(base),
    }
    choice = choose_weights(tensors, "cpu", MiB // 2)
    (region,) = choice.regions
    assert region.name == "owner" and region.nbytes == MiB
    assert all(p.storage.resizable() for p in region.pieces)


def test_a_numpy_export_makes_a_cpu_storage_borrowed_as_torch_marks_it() -> None:
    """torch marks a storage shared with numpy non-resizable; the choice reads it as borrowed."""
    weights = torch.ones(MiB // 4)
    weights.numpy()
    with pytest.raises(WeightsError, match="1 borrowed"):
        choose_weights({"w": weights}, "cpu", MiB // 2)
