"""Issue 21, "attack the result again": what a second hostile probe found, case by case.

Case -> outcome:

- a tensor subclass whose ``__torch_function__`` answers ``untyped_storage()``
  with memory only the plugin would hold -> its own storage is what counts
  (64 bytes: nothing credited);
- ``resident_tensors()`` returning fresh copies (``W.contiguous()`` of a
  non-contiguous weight) -> credit 0, one line: nothing but the plugin would
  hold them; weights the host drops after the hook -> stock from the next
  read, with the reason in the audit;
- a value whose ``repr`` is slow or huge (a list of 100,000 tensors, a
  200,000-entry mapping, a class whose ``__repr__`` must not run) -> named in
  bounded time, by type where its repr is the host's own code;
- ``evicting_from(exclude=None | 5 | "glob")`` -> 0 and one line in the
  program's words, never a raise on entry, never a string split into globs;
  a mapping whose first value is no tensor -> named as such;
- ``add_reclaimed`` returning an awaitable -> recorded as raised (report and
  audit say RAISED), the coroutine closed, never "credited" silently;
- a ``KeyboardInterrupt`` from a runtime attribute with nothing offered -> the
  start-up ends, a retry with a fresh runtime credits;
- a JSON or YAML config with a key twice -> refused, never last-one-wins;
- an index naming a shard outside its folder -> refused by name;
- ``example --out`` into a directory holding symlinks named as its files ->
  refused, nothing written through them.

A second probe of the fixed code found, and these tests hold:

- a host mode that records every op output while the hook runs (torch's
  ``DebugMode(store_original_args=True)``, any dispatch or function mode),
  flushed after it -> the host's ``nn.Parameter`` is still the host's: no
  fallback mid-start-up (the eviction counts its own tensors, not a
  difference of counts);
- a copy kept only by a reference cycle -> credit 0 at the hook;
- an object whose ``__class__`` claims ``torch.Tensor`` with an endless shape,
  ``evicting_from(weights.values())``, a Mapping whose ``items()`` blocks ->
  named by type at once;
- ``evicting_from(on_error=<object whose == raises>)`` -> 0, one line.

The tensor-parallel case (a program's block on one rank shifting the next
agreement) is ``test_tp_gloo.py::test_a_program_block_on_one_rank_...``.
The host's runtime and allocator are stand-ins (named so); pluggy, the plugin,
b12x's real seam and torch are real.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from support.figures import MiB
from torch.utils._python_dispatch import TorchDispatchMode

import flare_l2evict
from flare_l2evict import ConfigError, L2EvictError, load_deployment_config, plugin
from flare_l2evict._b12x.table import stock_row
from flare_l2evict._errors import CheckpointError
from flare_l2evict._lifecycle import active_installation
from flare_l2evict._text import described_value
from flare_l2evict.tools._headers import read_checkpoint
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator,
    ReferenceRuntime,
    plugin_manager,
)

measurement = pytest.importorskip(stock_row().module_path)
PM = plugin_manager(["l2evict"])
L2 = 8 * MiB  # stock's window: 64 MiB


@pytest.fixture(autouse=True)
def _finished() -> Any:
    yield
    plugin.finish()


def runtime(
    tensors: Any, allocator: Any = None, kind: type[ReferenceRuntime] = ReferenceRuntime
) -> ReferenceRuntime:
    return kind(
        device=torch.device("cpu"),
        config={},
        kv_allocator=allocator or ReferenceKVAllocator(1024),
        race_jobs=2,
        l2_cache_bytes=L2,
        tensors=tensors,
    )


class CopyingRuntimeStandIn(ReferenceRuntime):
    """A host whose ``resident_tensors()`` returns a fresh copy of each weight, every call."""

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        return {name: t.contiguous() for name, t in self.tensors.items()}


class LazyStorageTensorStandIn(torch.Tensor):
    """A host tensor subclass that builds a fresh 128 MiB storage whenever asked for one."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.untyped_storage:
            return torch.zeros(128 * MiB // 4).untyped_storage()
        return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]


def test_a_subclass_cannot_answer_for_its_storage() -> None:
    lazy = torch.zeros(16).as_subclass(LazyStorageTensorStandIn)  # 64 bytes really held
    host = runtime({"w": lazy})
    (report,) = PM.hook.before_first_capture(runtime=host)
    assert report.reclaimed_bytes == 0 and host.kv_allocator.reclaimed_bytes == 0
    assert "64 distinct bytes" in (report.reason or "")


def test_fresh_copies_from_resident_tensors_are_not_credited() -> None:
    weight = torch.zeros(128 * MiB // 4).view(-1, 1024).t()  # non-contiguous: .contiguous() copies
    host = runtime({"w": weight}, kind=CopyingRuntimeStandIn)
    (report,) = PM.hook.before_first_capture(runtime=host)
    assert report.reclaimed_bytes == 0 and host.kv_allocator.reclaimed_bytes == 0
    assert (report.reason or "").startswith("nothing but the plugin holds the storage of 'w'")
    assert "fix: resident_tensors() must return the tensors" in (report.reason or "")
    assert active_installation() is None
    assert getattr(measurement, stock_row().function).__module__ == measurement.__name__


def test_the_hosts_own_tensors_are_credited_and_dropping_them_later_falls_back() -> None:
    weights = {"w": torch.zeros(128 * MiB // 4)}
    host = runtime(weights)
    (report,) = PM.hook.before_first_capture(runtime=host)
    assert report.reclaimed_bytes > 0  # held by the host: credited as before
    installed = active_installation()
    assert installed is not None
    eviction = installed.eviction
    eviction()  # reads the weights
    weights.clear()  # the host drops them: only the plugin would keep them alive
    eviction()
    audit = PM.hook.startup_complete(runtime=host)[0]
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
    host = runtime(tensors)
    if kept == "aliases":
        host.tensors = {"w": model["w"].data}  # a new alias each time the host builds it
    (report,) = PM.hook.before_first_capture(runtime=host)
    assert report.reclaimed_bytes > 0, report.reason
    host.tensors = {}
    del tensors, base
    if kept == "storage-object":
        model.clear()  # only the storage object is left to the host
    installed = active_installation()
    assert installed is not None
    installed.eviction()
    audit = PM.hook.startup_complete(runtime=host)[0]
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
    host = runtime({})
    host.tensors = dict(model.named_parameters())
    recorder = RecordingModeStandIn()
    with recorder:
        (report,) = PM.hook.before_first_capture(runtime=host)
    assert recorder.seen  # it saw the plugin's own ops (its views) while the hook ran
    recorder.seen.clear()  # the recorder is flushed; the model keeps its parameter
    host.tensors = {}
    installed = active_installation()
    assert report.reclaimed_bytes > 0 and installed is not None, report.reason
    installed.eviction()
    audit = PM.hook.startup_complete(runtime=host)[0]
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
    host = runtime({"w": weight}, kind=CopyingInACycleRuntimeStandIn)
    (report,) = PM.hook.before_first_capture(runtime=host)
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
    host = runtime({})
    host.tensors = value  # type: ignore[assignment]
    (report,) = PM.hook.before_first_capture(runtime=host)
    assert report.reclaimed_bytes == 0 and "\n" not in (report.reason or "")


class EqRaisesStandIn:
    """A value whose ``==`` raises: comparing it must not escape the fallback."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("host __eq__")

    __hash__ = object.__hash__


def test_an_on_error_whose_eq_raises_is_one_line_in_a_program() -> None:
    with flare_l2evict.evicting_from(
        {"w": torch.zeros(4)},
        race_jobs=2,
        on_error=EqRaisesStandIn(),  # type: ignore[arg-type]
    ) as report:
        assert report.reclaimed_bytes == 0
    assert (report.reason or "").startswith("evicting_from: on_error = <EqRaisesStandIn>")


class ReprMustNotRunStandIn:
    """A host object whose ``__repr__`` would walk a whole model (here: fails the test)."""

    def __repr__(self) -> str:
        raise AssertionError("the host's __repr__ ran")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (ReprMustNotRunStandIn(), "<a ReprMustNotRunStandIn>"),
        ([torch.zeros(1)] * 100_000, "[<Tensor>, <Tensor>"),
        ({i: None for i in range(200_000)}, "{0: null, 1: null"),
        (torch.zeros(1000, 1000), "<a Tensor of shape (1000, 1000) (torch.float32)>"),
        ("n" * 10**6, "...[1,000,000 chars]"),
        (10**5000, "<int of 16,610 bits>"),
    ],
    ids=["host-repr", "100k-tensors", "200k-mapping", "tensor", "long-str", "huge-int"],
)
def test_values_are_described_in_bounded_time(value: object, expected: str) -> None:
    text = described_value(value, 80)
    assert expected in text and len(text) <= 80 and "\n" not in text


def test_a_list_of_tensors_passed_as_the_mapping_is_named_at_once() -> None:
    tensors = [torch.zeros(1)] * 100_000  # list(model.parameters()) by mistake
    with flare_l2evict.evicting_from(tensors, race_jobs=2) as report:  # type: ignore[arg-type]
        assert report.reclaimed_bytes == 0
    assert (report.reason or "").startswith("evicting_from: tensors is [<Tensor>")
    assert len(report.reason or "") < 1000


@pytest.mark.parametrize(
    ("exclude", "shown"),
    [(None, "exclude = null"), (5, "exclude = 5"), ("*.embed_tokens.*", 'exclude = "*.embed')],
    ids=["none", "int", "one-string"],
)
def test_bad_exclude_in_a_program_is_one_line_never_a_raise(exclude: object, shown: str) -> None:
    tensors = {"model.embed_tokens.weight": torch.zeros(128 * MiB // 4)}
    with flare_l2evict.evicting_from(
        tensors,
        race_jobs=2,
        l2_cache_bytes=L2,
        exclude=exclude,  # type: ignore[arg-type]
    ) as report:
        assert report.reclaimed_bytes == 0 and active_installation() is None
    reason = report.reason or ""
    assert reason.startswith(f"evicting_from: {shown}") and "plugins.l2evict" not in reason
    assert "fix: pass window=, exclude= (a list of globs)" in reason


def test_a_mapping_whose_first_value_is_no_tensor_is_named_so() -> None:
    tensors = {"a": [1, 2, 3], "b": torch.zeros(4)}
    with flare_l2evict.evicting_from(tensors, race_jobs=2) as report:  # type: ignore[arg-type]
        assert report.reclaimed_bytes == 0
    assert (report.reason or "").startswith(
        "evicting_from: the first value of tensors is [1, 2, 3], not a tensor"
    )


class AwaitableAllocatorStandIn(ReferenceKVAllocator):
    """An allocator whose plain ``add_reclaimed`` returns a coroutine it never awaits."""

    def __init__(self) -> None:
        super().__init__(1024)
        self.add_reclaimed = self._returns_coroutine  # type: ignore[method-assign]

    def _returns_coroutine(self, report: flare_l2evict.ReclaimReport) -> Any:
        async def apply() -> None:
            self.reclaimed_bytes += report.reclaimed_bytes

        return apply()


def test_an_allocator_returning_an_awaitable_is_recorded_as_raised() -> None:
    allocator = AwaitableAllocatorStandIn()
    host = runtime({"w": torch.zeros(128 * MiB // 4)}, allocator)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... never awaited"
        (report,) = PM.hook.before_first_capture(runtime=host)
        audit = PM.hook.startup_complete(runtime=host)[0]
    assert allocator.reclaimed_bytes == 0
    assert (report.allocator_error or "").startswith("RuntimeContractError: kv_allocator")
    assert "returned coroutine (an awaitable)" in (report.allocator_error or "")
    assert "RAISED" in audit.summary()


class InterruptingRuntimeStandIn(ReferenceRuntime):
    """A host whose ``race_jobs`` property raises ``KeyboardInterrupt`` (Ctrl-C mid-hook)."""

    @property
    def race_jobs(self) -> int:
        raise KeyboardInterrupt

    @race_jobs.setter
    def race_jobs(self, _value: int) -> None:
        pass


def test_an_interrupt_with_nothing_offered_lets_a_fresh_runtime_start() -> None:
    broken = runtime({"w": torch.zeros(128 * MiB // 4)}, kind=InterruptingRuntimeStandIn)
    with pytest.raises(KeyboardInterrupt):
        PM.hook.before_first_capture(runtime=broken)
    retry = runtime({"w": torch.zeros(128 * MiB // 4)})
    (report,) = PM.hook.before_first_capture(runtime=retry)
    assert report.reclaimed_bytes > 0, report.reason
    assert retry.kv_allocator.reclaimed_bytes == report.reclaimed_bytes


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("twice.json", '{"plugins": {"l2evict": {"on_error": "raise", "on_error": "fallback"}}}'),
        ("twice.yaml", "plugins:\n  l2evict:\n    on_error: raise\n    on_error: fallback\n"),
    ],
)
def test_a_key_given_twice_is_refused_not_last_one_wins(
    tmp_path: Path, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_deployment_config(path)
    message = str(caught.value)
    assert 'key "on_error" appears twice in one mapping' in message and "; fix: " in message


@pytest.mark.parametrize("shard", ["/etc/hostname", "../outside.safetensors", "a/../../b"])
def test_an_index_cannot_name_a_shard_outside_its_folder(tmp_path: Path, shard: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"w": shard}}))
    with pytest.raises(CheckpointError, match="lies outside the index's folder"):
        read_checkpoint([index])


def test_example_out_never_writes_through_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "ex"
    out.mkdir()
    (out / "deploy.toml").symlink_to(victim)
    done = subprocess.run(
        [sys.executable, "-m", "flare_l2evict", "example", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and victim.read_text() == "keep"
    assert "deploy.toml there is a symlink" in done.stderr and "nothing written" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["deploy.toml"]


def test_the_example_writes_exactly_the_files_it_names(tmp_path: Path) -> None:
    from flare_l2evict.tools._example import EXAMPLE_FILES, write_example

    written = write_example(tmp_path / "ex", 64 * MiB)
    assert sorted(p.name for p in written) == sorted(EXAMPLE_FILES)


def test_on_error_raise_still_raises_for_a_program_argument() -> None:
    with (
        pytest.raises(L2EvictError, match="evicting_from: exclude = 5"),
        flare_l2evict.evicting_from(
            {"w": torch.zeros(4)},
            race_jobs=2,
            exclude=5,  # type: ignore[arg-type]
            on_error="raise",
        ),
    ):
        raise AssertionError("the block must not run")
