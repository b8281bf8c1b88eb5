"""What a host's runtime may hold, and the outcome: whatever it passes, the hook credits 0 with
one line naming the value and stock b12x stays, or credits what stock would allocate; under
``on_error = "fallback"`` it never raises.

The host's runtime is code the plugin does not own, so it is a stand-in here (named so:
``support/hostile.py``'s, or one per case); pluggy, the plugin, b12x's seam and torch are real.
The host's calls (its allocator, its threads, calling twice) are in ``test_host_calls.py``; a
process group whose size differs from ``world_size`` in ``test_tp_gloo.py`` (real gloo
processes); ``runtime.kv_sizing``'s values in ``test_kv_sizing.py``.

Value -> outcome:

- any attribute out of range (``race_jobs``, ``rank``, ``world_size``, ``device``,
  ``l2_cache_bytes``, ``config``, ``kv_allocator``) -> 0 with one line naming it and what it
  accepts; a CUDA device where CUDA is not available -> the same;
- an attribute (or ``add_reclaimed``) that is a raising property -> 0 with one line naming it;
- a value whose ``repr`` or ``__class__`` raises, an exception whose message raises, or
  whose type's name raises -> 0;
- a config with an unknown key -> 0; an ``on_error`` equal to anything -> never "raise";
- ``on_error = "raise"`` with a contract violation -> one line raised, stock b12x restored;
- ``resident_tensors()`` empty, on the meta device, or too small -> 0 with the reason; a bare
  tensor -> named, never iterated; a list or ``None`` -> named; endless names -> refused in
  bounded memory; a name that is not a string -> one line; a wrapper subclass without
  storage -> skipped; a name that forges a log line or runs to 5 MB -> one bounded line;
- storages that overlap in memory -> counted once; a window they cannot cover: 0; a storage
  that overstates its size -> its real size, never grown;
- an L2 of 50 MiB + 1 byte, no window set -> credited: stock's window in whole words;
- ``race_jobs``, ``l2_cache_bytes`` and ``device`` at and past their bounds -> a host and an
  ``evicting_from`` program refuse the same values;
- any values at all (a property test) -> never raises, never over-credits, nothing left
  installed without a credit.
"""

from __future__ import annotations

import itertools
import logging
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from support.figures import OWN, MiB
from support.hostile import (
    HostileAllocatorStandIn,
    HostileRuntimeStandIn,
    aliases,
    hostile,
)
from support.hosts import CREDIT, JOBS, L2, hook, runtime, seam_is_ours, weights
from support.startups import end_any, eviction_of, installed
from support.sums import read_bytes

import flare_l2evict
from flare_l2evict import L2EvictError, _request
from flare_l2evict._credit import stock_buffer_bytes
from flare_l2evict._startup import Startup
from flare_l2evict._weights import MAX_TENSORS
from flare_l2evict.hookspecs import RUNTIME_ATTRIBUTES
from flare_l2evict.tools._choose_weights import choose_weights
from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime

measurement = pytest.importorskip("b12x.preparation._measurement")
ATTRIBUTES = RUNTIME_ATTRIBUTES


# The stand-in.
def test_hostile_runtime_stand_in_is_a_runtime() -> None:
    """The stand-in reads like a host's object, so the cases above test the real contract."""
    runtime = hostile()
    seen: Mapping[str, Any] = {name: getattr(runtime, name) for name in ATTRIBUTES}
    assert seen["device"] == torch.device("cpu") and callable(seen["resident_tensors"])
    report = hook(runtime)
    assert report.reclaimed_bytes == CREDIT == runtime.kv_allocator.applied


# Values out of range, or of the wrong kind.
RUNTIME_CASES: list[tuple[str, object, str]] = [
    ("race_jobs", -1, "runtime.race_jobs = -1: the host must pass a whole number in 0..1024"),
    ("race_jobs", 10**9, "runtime.race_jobs = 1000000000"),
    ("rank", 3, "runtime.rank = 3: the host must pass a whole number in 0..0"),
    ("rank", -1, "runtime.rank = -1"),
    ("world_size", 0, "runtime.world_size = 0: the host must pass a whole number >= 1"),
    ("device", "tpu", "runtime.device = 'tpu'"),
    ("device", 7, "runtime.device = 7"),
    ("l2_cache_bytes", -5, "runtime.l2_cache_bytes = -5"),
    ("l2_cache_bytes", None, "runtime.l2_cache_bytes = None: the host must pass the L2 size"),
    ("config", [1], "runtime.config = [1]: the host must pass the deployment config"),
    ("kv_allocator", object(), "runtime.kv_allocator = <a object>"),
]


@pytest.mark.parametrize(
    ("name", "value", "line"), RUNTIME_CASES, ids=[c[2][:40] for c in RUNTIME_CASES]
)
def test_runtime_values_out_of_range_are_one_line(name: str, value: object, line: str) -> None:
    host_runtime = runtime(tensors={"w": torch.zeros(64 * MiB // 4)})
    setattr(host_runtime, name, value)
    report = hook(host_runtime)
    assert report.reclaimed_bytes == 0 and report.reason is not None
    assert line in report.reason and "\n" not in report.reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_without_cuda_names_runtime_device() -> None:
    host_runtime = runtime(tensors={"embed": torch.zeros(1 << 24)}, device="cuda:0")
    report = hook(host_runtime)
    assert report.reclaimed_bytes == 0 and report.reason is not None
    assert "runtime.device = device(type='cuda'" in report.reason
    assert "CUDA is not available here" in report.reason


def test_bad_config_in_the_hook_falls_back() -> None:
    host_runtime = runtime(
        tensors={"w": torch.zeros(1 << 25)}, config={"plugins": {"l2evict": {"x": 1}}}
    )
    report = hook(host_runtime)
    assert report.reclaimed_bytes == 0 and "unknown key" in (report.reason or "")
    assert host_runtime.kv_allocator.reclaimed_bytes == 0


def test_an_on_error_value_equal_to_anything_does_not_turn_fallback_into_raise() -> None:
    class EqualToAnythingStandIn:
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    config = {"plugins": {"l2evict": {"on_error": EqualToAnythingStandIn()}}}
    report = hook(hostile(config=config))
    assert report.reclaimed_bytes == 0 and "on_error" in (report.reason or "")


def test_an_odd_l2_with_the_stock_window_is_credited() -> None:
    runtime = hostile(tensors=weights(256 * MiB))
    odd = 50 * MiB + 1
    runtime.__class__ = type(
        "OddL2RuntimeStandIn", (HostileRuntimeStandIn,), {"l2_cache_bytes": odd}
    )
    report = hook(runtime)
    stock = -(-max(2 * odd, 64 * MiB) // 4) * 4
    assert report.window_bytes == stock
    assert report.reclaimed_bytes == JOBS * stock - OWN


# Values that raise when read, printed or inspected.
@pytest.mark.parametrize("name", [*ATTRIBUTES, "add_reclaimed"])
def test_a_raising_property_gives_zero_and_one_line(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = hostile()
    if name == "add_reclaimed":
        runtime.kv_allocator = RaisingAddReclaimedStandIn()
    else:
        runtime.raising = name
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(runtime)
    assert report.reclaimed_bytes == 0
    shown = "kv_allocator" if name == "add_reclaimed" else name
    assert report.reason is not None
    # The attribute as it was read, then what it raised (every attribute, kv_sizing's too).
    assert report.reason.startswith(f"runtime.{shown} raised ")
    assert "RuntimeError: host property" in report.reason and "exploded" in report.reason
    assert installed() is None and not seam_is_ours()
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and "\n" not in line.getMessage()


class RaisingAddReclaimedStandIn:
    """An allocator whose add_reclaimed is a property that raises."""

    @property
    def add_reclaimed(self) -> Callable[[object], None]:
        raise RuntimeError("host property add_reclaimed exploded")


class UnprintableStandIn:
    """A host value whose repr raises."""

    def __repr__(self) -> str:
        raise RuntimeError("repr")


class RaisingClassStandIn:
    """A host value whose __class__ raises, so even isinstance() on it raises."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("__class__")


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise ValueError("no text")


@pytest.mark.parametrize(
    "change",
    [
        {"device": UnprintableStandIn()},
        {"rank_": RaisingClassStandIn()},
        {"race_jobs_": RaisingClassStandIn()},
        {"tensors": UnprintableStandIn()},
    ],
    ids=["device-repr", "rank-class", "race-jobs-class", "tensors-repr"],
)
def test_host_values_that_cannot_be_printed_or_inspected_give_zero(change: dict[str, Any]) -> None:
    runtime = hostile()
    for name, value in change.items():
        if name == "device":  # a property: shadow it on a subclass
            runtime.__class__ = type(
                "DeviceRuntimeStandIn", (HostileRuntimeStandIn,), {name: value}
            )
        else:
            setattr(runtime, name, value)
    report = hook(runtime)
    assert report.reclaimed_bytes == 0 and report.reason and "\n" not in report.reason


def test_an_exception_whose_message_raises_gives_zero() -> None:
    class RaisingTensorsStandIn(HostileRuntimeStandIn):
        def resident_tensors(self) -> Any:
            raise UnprintableError

    report = hook(RaisingTensorsStandIn(HostileAllocatorStandIn(), weights()))
    assert report.reclaimed_bytes == 0
    assert "UnprintableError: <its message could not be read>" in (report.reason or "")


# on_error = "raise" raises for every contract violation, after restoring stock b12x.
@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"race_jobs_": -1}, "runtime.race_jobs = -1"),
        ({"world_size_": 2}, "runtime.process_group = None"),
        ({"config": {"plugins": {"l2evict": {"on_error": "raise", "x": 1}}}}, "unknown key"),
        ({"raising": "device"}, "runtime.device raised RuntimeError"),
    ],
    ids=["race_jobs", "no-group", "unknown-key", "raising-device"],
)
def test_on_error_raise_raises_for_contract_violations(change: dict[str, Any], line: str) -> None:
    runtime = hostile()
    runtime.config = {"plugins": {"l2evict": {"on_error": "raise"}}}
    for name, value in change.items():
        setattr(runtime, name, value)
    with pytest.raises(L2EvictError, match="on_error = 'raise'") as raised:
        hook(runtime)
    assert line in str(raised.value) and "\n" not in str(raised.value)
    assert runtime.kv_allocator.applied == 0
    assert installed() is None and not seam_is_ours()


# What resident_tensors() returns.
@pytest.mark.parametrize(
    ("tensors", "reason"),
    [
        ({}, "no resident checkpoint tensors"),
        ({"meta": torch.empty(1 << 30, device="meta")}, "1 meta"),
        ({"small": torch.zeros(16)}, "covers the"),
    ],
)
def test_fallbacks_report_zero_with_the_reason(
    tensors: dict[str, torch.Tensor],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(runtime(tensors=tensors))
    assert report.reclaimed_bytes == 0 and reason in (report.reason or "")
    assert report.mechanism == "none"
    assert measurement._l2_flush_fn.__name__ == "_l2_flush_fn"
    assert installed() is None
    lines = [r for r in caplog.records if r.name.startswith("flare_l2evict")]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING


class NeverIteratedTensorStandIn(torch.Tensor):
    """A tensor that fails the test if anything iterates its elements."""

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("the plugin iterated a tensor's elements")


def test_a_bare_tensor_from_resident_tensors_is_named_without_iterating_it() -> None:
    bare = torch.zeros(4_000_000).as_subclass(NeverIteratedTensorStandIn)
    report = hook(hostile(tensors=bare))
    assert report.reclaimed_bytes == 0
    assert report.reason is not None
    assert "resident_tensors() returned a Tensor of shape (4000000,)" in report.reason
    assert "not a mapping of names to tensors" in report.reason


@pytest.mark.parametrize(
    ("returned", "named"), [([1, 2], "a list of 2 items"), (None, "a NoneType")]
)
def test_other_non_mappings_are_named(returned: object, named: str) -> None:
    report = hook(hostile(tensors=returned))
    assert report.reclaimed_bytes == 0 and f"returned {named}" in (report.reason or "")


def test_a_mapping_with_endless_names_is_refused_in_bounded_memory() -> None:
    class EndlessMappingStandIn(Mapping[str, torch.Tensor]):
        def __getitem__(self, key: str) -> torch.Tensor:
            return torch.zeros(1)

        def __iter__(self) -> Iterator[str]:
            return (f"t{i}" for i in itertools.count())

        def __len__(self) -> int:
            return 1 << 62

    report = hook(hostile(tensors=EndlessMappingStandIn()))
    assert report.reclaimed_bytes == 0 and f"more than {MAX_TENSORS:,} names" in (
        report.reason or ""
    )


def test_a_tensor_name_that_is_not_a_string_is_one_line() -> None:
    report = hook(runtime(tensors={7: torch.zeros(64 * MiB // 4)}))
    assert report.reclaimed_bytes == 0 and report.reason is not None
    assert report.reason.startswith("resident tensor name 7 has type int, not str; fix:")
    assert "\n" not in report.reason and "validation" not in report.reason.lower()


def test_a_wrapper_subclass_without_storage_bytes_is_skipped_not_fatal() -> None:
    class WrapperTensorStandIn(torch.Tensor):
        """A DTensor-like wrapper: a tensor with no readable storage of its own."""

        @staticmethod
        def __new__(cls, size: int) -> Any:
            return torch.Tensor._make_wrapper_subclass(cls, (size,), dtype=torch.float32)

        @classmethod
        def __torch_dispatch__(  # type: ignore[override]  # a classmethod, as torch's own are
            cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            raise NotImplementedError

    tensors = {"wrapped": WrapperTensorStandIn(1 << 28), **weights()}
    report = hook(hostile(tensors=tensors))
    assert report.reclaimed_bytes == CREDIT
    assert report.source_tensor == "model.layers.0.mlp.experts.w13_weight"


class ForgingNameStandIn(str):
    """A tensor name whose repr forges a second log line."""

    def __repr__(self) -> str:
        return "w'\nINFO flare_l2evict: reclaimed 0 bytes (forged)"


@pytest.mark.parametrize(
    "name", [ForgingNameStandIn("w"), "w" * 5_000_000], ids=["forged-repr", "5-MB-name"]
)
def test_echoed_names_stay_on_one_bounded_line(name: str, caplog: pytest.LogCaptureFixture) -> None:
    runtime = hostile(tensors={name: torch.zeros(128 * MiB // 4)})
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        first = hook(runtime)
        again = hook(runtime)  # the refusal names the active installation
    assert first.reclaimed_bytes == CREDIT and again.reclaimed_bytes == 0
    for record in caplog.records:
        text = record.getMessage()
        assert "\n" not in text and len(text) < 2_000, text[:300]
    assert again.reason is not None and "\n" not in again.reason


# Storages that overlap, or overstate their size.
def test_storages_that_overlap_in_memory_count_once() -> None:
    tensors = aliases(130, MiB)
    assert len({id(t.untyped_storage()) for t in tensors.values()}) == 131
    report = hook(hostile(tensors=tensors))
    assert report.reclaimed_bytes == 0
    assert "1 eligible storage holds 1,048,576 distinct bytes" in (report.reason or "")


def test_partly_overlapping_storages_are_read_once_each_byte() -> None:
    base = torch.zeros(96 * MiB // 4).untyped_storage()
    tensors = {
        "owner": torch.empty(0).set_(base),
        "a": torch.empty(0).set_(base[0 : 64 * MiB], 0, (16 * MiB,), (1,)),
        "b": torch.empty(0).set_(base[32 * MiB : 96 * MiB], 0, (16 * MiB,), (1,)),
    }
    choice = choose_weights(tensors, "cpu", 96 * MiB)
    (region,) = choice.regions
    assert region.nbytes == 96 * MiB and read_bytes(choice) == 96 * MiB
    with pytest.raises(flare_l2evict.WeightsError, match=r"96.*distinct bytes"):
        choose_weights(tensors, "cpu", 128 * MiB)  # 2 x 64 MiB, but 96 distinct


class OverstatedStorageStandIn(torch.UntypedStorage):
    """A storage whose Python-level size claims a gigabyte over one mebibyte."""

    def __len__(self) -> int:
        return 1 << 30

    def nbytes(self) -> int:
        return 1 << 30


def test_a_storage_cannot_overstate_its_size_or_be_grown() -> None:
    tensor = torch.empty(0).set_(OverstatedStorageStandIn(MiB))  # type: ignore[no-untyped-call]
    address = tensor.data_ptr()
    report = hook(hostile(tensors={"w": tensor}))
    assert report.reclaimed_bytes == 0 and "1,048,576 distinct bytes" in (report.reason or "")
    assert tensor.data_ptr() == address
    assert torch.UntypedStorage.nbytes(tensor.untyped_storage()) == MiB  # never written


# Host and program values meet one set of bounds.
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("race_jobs", -1),
        ("race_jobs", 0),
        ("race_jobs", _request.MAX_RACE_JOBS),
        ("race_jobs", _request.MAX_RACE_JOBS + 1),
        ("race_jobs", True),
        ("race_jobs", 2.0),
        ("l2_cache_bytes", 0),
        ("l2_cache_bytes", 1),
        ("l2_cache_bytes", _request.MAX_L2_BYTES),
        ("l2_cache_bytes", _request.MAX_L2_BYTES + 1),
        ("l2_cache_bytes", None),
        ("device", "cuda:0"),
        ("device", "tpu"),
    ],
)
def test_host_and_program_values_meet_one_set_of_bounds(name: str, value: object) -> None:
    asked: dict[str, Any] = {"race_jobs": JOBS, "l2_cache_bytes": L2, "device": "cpu"}
    asked[name] = value
    host = runtime(race_jobs=asked["race_jobs"])
    host.l2_cache_bytes, host.device = asked["l2_cache_bytes"], asked["device"]
    host_refused = (hook(host).reason or "").startswith(f"runtime.{name} ")
    end_any()
    with flare_l2evict.evicting_from(weights(), **asked) as report:
        program_refused = (report.reason or "").startswith(f"evicting_from: {name} =")
    assert host_refused == program_refused, (name, value)


# An exception whose type has no readable name (a hostile review of the start-up object).
class NamelessMeta(type):
    """An exception type whose very name raises."""

    def __getattribute__(cls, name: str) -> Any:
        if name == "__name__":
            raise RuntimeError("no name")
        return super().__getattribute__(name)


class NamelessError(Exception, metaclass=NamelessMeta):
    pass


class NamelessRaisingRuntimeStandIn(ReferenceRuntime):
    @property
    def race_jobs(self) -> int:
        raise NamelessError("host")

    @race_jobs.setter
    def race_jobs(self, value: int) -> None:
        pass


def test_an_exception_whose_type_has_no_readable_name_falls_back_in_one_line() -> None:
    report = hook(runtime(kind=NamelessRaisingRuntimeStandIn))
    assert report.reclaimed_bytes == 0 and "runtime.race_jobs raised" in (report.reason or "")
    assert Startup.active() is not None and not seam_is_ours()


# Any values at all.
@dataclass
class FuzzedRuntimeStandIn:
    """A host runtime with arbitrary attribute values (a host's own object cannot exist here)."""

    device: Any
    rank: Any
    world_size: Any
    race_jobs: Any
    l2_cache_bytes: Any
    config: Any
    kv_allocator: Any
    tensors: Mapping[str, Any] = field(default_factory=dict)
    process_group: Any = None

    def resident_tensors(self) -> Mapping[str, Any]:
        return self.tensors


any_value = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10), st.text(max_size=8), st.floats(allow_nan=True)
)

windows = st.one_of(st.just("stock"), st.integers(-1, 1 << 28), st.text(max_size=6), st.none())


@pytest.mark.slow  # a property test: 150 examples, each a real start-up
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    device=st.one_of(
        st.sampled_from(["cpu", "cuda:0", "meta", "cpu:5", torch.device("cpu")]), any_value
    ),
    rank=st.one_of(st.integers(-2, 4), any_value),
    world_size=st.one_of(st.integers(-1, 4), any_value),
    race_jobs=st.one_of(st.integers(-3, 9), st.just(10**9), any_value),
    l2=st.one_of(st.sampled_from([MiB, 16 * MiB, 64 * MiB]), st.integers(-1, 1 << 34), any_value),
    window=windows,
    tensor_floats=st.lists(st.integers(0, 48 * MiB // 4), max_size=3),
    allocator=st.sampled_from(["reference", "raising", "none", "no-method"]),
    config_shape=st.sampled_from(["section", "list", "none", "plugins-list"]),
)
def test_the_hook_never_raises_and_never_over_credits(
    device: Any,
    rank: Any,
    world_size: Any,
    race_jobs: Any,
    l2: Any,
    window: Any,
    tensor_floats: list[int],
    allocator: str,
    config_shape: str,
) -> None:
    kv: Any = {
        "reference": ReferenceKVAllocator(1024),
        "raising": HostileAllocatorStandIn("raise-before"),
        "none": None,
        "no-method": object(),
    }[allocator]
    config: Any = {
        "section": {"plugins": {"l2evict": {"window": window}}},
        "list": [1, 2],
        "none": None,
        "plugins-list": {"plugins": ["l2evict"]},
    }[config_shape]
    tensors = {f"w{i}": torch.zeros(n) for i, n in enumerate(tensor_floats)}
    runtime = FuzzedRuntimeStandIn(device, rank, world_size, race_jobs, l2, config, kv, tensors)
    try:
        report = hook(runtime)
        installation = installed()
        if report.reclaimed_bytes == 0:
            assert installation is None  # nothing left installed without a credit
        else:
            assert installation is not None
            assert isinstance(race_jobs, int) and isinstance(l2, int)
            assert report.reclaimed_bytes <= race_jobs * stock_buffer_bytes(l2)
            assert eviction_of(installation).read_bytes >= report.window_bytes
        credited = getattr(kv, "reclaimed_bytes", None)
        if credited is not None:
            assert credited == report.reclaimed_bytes
    finally:
        end_any()


class _SelfishName(str):
    """A module name whose own methods raise: the scan of sys.modules must never call them."""

    def startswith(self, *args: Any) -> bool:
        raise RuntimeError("host str.startswith")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("host str.__eq__")

    __hash__ = str.__hash__


class _HashedNameStandIn(str):
    """A module name whose ``__hash__`` counts its calls: the scan must hash no key."""

    calls = 0

    def __hash__(self) -> int:
        type(self).calls += 1
        return str.__hash__(self)


class _ClasslessKeyStandIn:
    """A key that is no str and raises when asked its ``__class__`` (as ``isinstance`` does)."""

    @property  # type: ignore[misc]  # a property over __class__, as a host's proxy may have
    def __class__(self) -> type:
        raise RuntimeError("host __class__")


class _PosingAsAModule:
    __class__ = types.ModuleType  # type: ignore[assignment]  # isinstance() says module


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (1, types.ModuleType("one")),
        (b"b12x", types.ModuleType("bytes")),
        (("b12x",), types.ModuleType("tuple")),
        (_SelfishName("b12x.selfish"), types.ModuleType("selfish")),
        ("b12x.posing", _PosingAsAModule()),
        ("b12xfoo", types.ModuleType("b12xfoo")),
        (_ClasslessKeyStandIn(), types.ModuleType("classless")),
    ],
    ids=["int", "bytes", "tuple", "str-subclass", "posing-module", "b12xfoo", "classless-key"],
)
def test_odd_entries_in_sys_modules_are_skipped_and_the_start_up_credits(
    key: Any, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 41: a scan that called each key's startswith fell back, 0 bytes, on an int key.
    monkeypatch.setitem(sys.modules, key, value)
    host = runtime()
    assert hook(host).reclaimed_bytes == CREDIT


def test_the_scan_of_sys_modules_hashes_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 46: the scan looked each name up again (sys.modules.get), which ran a str
    # subclass's own __hash__, though its comment said no method of the key runs.
    key = _HashedNameStandIn("b12x.hashed")
    monkeypatch.setitem(sys.modules, key, types.ModuleType("hashed"))
    host = runtime()
    _HashedNameStandIn.calls = 0
    assert hook(host).reclaimed_bytes == CREDIT
    assert _HashedNameStandIn.calls == 0


class _BrokenLazyModuleStandIn(types.ModuleType):
    """A lazy module whose load fails: reading any attribute raises (importlib's _LazyModule)."""

    def __getattribute__(self, name: str) -> Any:
        raise ImportError("lazy load failed: no module named cutlass_x")


def test_a_broken_lazy_module_is_named_with_the_scan_that_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 46: the fallback's line was the bare ImportError, naming neither module nor scan.
    monkeypatch.setitem(sys.modules, "b12x.lazy", _BrokenLazyModuleStandIn("b12x.lazy"))
    report = hook(runtime())
    assert report.reclaimed_bytes == 0 and report.reason is not None
    assert report.reason.startswith(
        'sys.modules["b12x.lazy"] raised ImportError: lazy load failed: no module named '
        "cutlass_x when read by the plugin's scan of b12x's loaded modules"
    )
    assert "fix: make `import b12x.lazy` succeed before start-up" in report.reason


class _RaisingConfigStandIn(Mapping[str, Any]):
    """A host's config mapping that raises on one kind of read: ``get`` of the top level,
    iteration of the top level (the near-miss scan, with no plugins table), or iteration of
    the plugin's own section (its copy)."""

    def __init__(self, fails: str) -> None:
        self.fails = fails

    def __getitem__(self, key: str) -> Any:
        if self.fails == "section" and key == "plugins":
            return {"l2evict": _RaisingConfigStandIn("iteration")}
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        if self.fails == "get":
            raise RuntimeError("host config get")
        return super().get(key, default)

    def __iter__(self) -> Iterator[str]:
        if self.fails in ("iteration", "scan"):
            raise RuntimeError(f"host config {self.fails}")
        return iter(())

    def __len__(self) -> int:
        return 1  # truthy: the reference runtime takes an empty config for none


@pytest.mark.parametrize(
    ("fails", "raised"),
    [("get", "get"), ("scan", "scan"), ("section", "iteration")],
    ids=["get", "near-miss-scan", "section-copy"],
)
def test_a_config_mapping_that_raises_is_named_as_runtime_config(fails: str, raised: str) -> None:
    # Issue 46: the line was the host's bare exception, or named "[the deployment config]".
    config: Any = _RaisingConfigStandIn(fails)  # a Mapping, where the reference host's is a dict
    report = hook(runtime(config=config))
    assert report.reclaimed_bytes == 0 and report.reason is not None
    assert report.reason.startswith(
        f"runtime.config raised RuntimeError: host config {raised} when read for "
        "[plugins.l2evict]: the host must pass the deployment config as a mapping"
    ), report.reason


def test_a_near_miss_from_a_hook_called_inside_an_except_block_is_no_raising_config() -> None:
    # The exception the host is handling is the context of any raise inside the hook: it is
    # not runtime.config's.
    try:
        raise LookupError("the host's own, being handled")
    except LookupError:
        report = hook(runtime(config={"plugins": {"l2evic": {}}}))
    assert report.reason is not None and report.reason.startswith("no [plugins.l2evict]"), (
        report.reason
    )
