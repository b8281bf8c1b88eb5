"""``flare_l2evict.evicting_from``: the start-up's promise for programs that are not flare hosts.

On the CPU, with b12x's real seam module (flashinfer's b12x): inside the block
every enabled call of the seam reads the named tensors; on exit, exceptions
included, stock b12x is back and nothing references them. The GPU test that
runs b12x's real races through it is ``tests/test_gpu_evicting.py``.

Case -> outcome (a program's arguments):

- ``exclude=None | 5 | "glob"`` -> 0 and one line in the program's words, never
  a raise on entry, never a string split into globs; ``on_error="raise"`` -> that
  line raised, the block not run;
- a list of 100,000 tensors as the mapping, a mapping whose first value is no
  tensor -> named as such, at once;
- ``on_error=<object whose == raises>`` -> 0, one line.
"""

from __future__ import annotations

import gc
import logging

import pytest
import torch
from support.figures import MiB
from support.hosts import (
    CREDIT,
    JOBS,
    L2,
    WEIGHT,
    complete,
    hook,
    runtime,
    seam,
    seam_is_ours,
    weights,
)
from support.startups import installed
from support.sums import checksum

import flare_l2evict
from flare_l2evict import L2EvictError
from flare_l2evict._eviction import EvictionHandle
from flare_l2evict.tools._origin import stock_row

pytest.importorskip(stock_row().module_path)


def test_inside_the_block_the_races_read_the_tensors_and_stock_is_back_after() -> None:
    tensors = weights()
    alive = tensors[WEIGHT].untyped_storage()._weak_ref()
    with flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2) as report:
        assert report.reclaimed_bytes == CREDIT
        assert report.mechanism == "stock-seam" and report.race_jobs == JOBS
        handle = seam()(torch.device("cpu"), enabled=True)  # type: ignore[operator]
        assert isinstance(handle, EvictionHandle)
        handle()
        assert checksum(handle.eviction) == 0.0  # read the zeros; wrote nothing
    assert not seam_is_ours() and installed() is None
    del tensors, handle
    gc.collect()
    assert torch.UntypedStorage._expired(alive)  # nothing references the tensors


def test_an_exception_inside_the_block_restores_stock_and_propagates() -> None:
    class ProgramFailedStandIn(Exception):
        """What the program's own race code raised."""

    resident = weights()  # the program keeps them: a mapping only the block held is not credited
    with (
        pytest.raises(ProgramFailedStandIn),
        flare_l2evict.evicting_from(resident, race_jobs=2, l2_cache_bytes=L2) as report,
    ):
        assert report.reclaimed_bytes > 0 and seam_is_ours()
        raise ProgramFailedStandIn
    assert not seam_is_ours() and installed() is None


def test_too_few_bytes_fall_back_with_the_reason_and_leave_b12x_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="flare_l2evict"),
        flare_l2evict.evicting_from(weights(MiB), race_jobs=2, l2_cache_bytes=L2) as report,
    ):
        assert report.reclaimed_bytes == 0 and "eligible storage" in (report.reason or "")
        assert not seam_is_ours()
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "stock b12x eviction kept" in line.getMessage() and "\n" not in line.getMessage()


def test_on_error_raise_raises_the_same_line() -> None:
    with (
        pytest.raises(L2EvictError, match=r"on_error = 'raise'.*eligible storages? holds?"),
        flare_l2evict.evicting_from(weights(MiB), race_jobs=2, l2_cache_bytes=L2, on_error="raise"),
    ):
        raise AssertionError("the block must not run")
    assert not seam_is_ours() and installed() is None


def test_settings_are_the_plugins_own() -> None:
    tensors = {"keep.me": torch.zeros(128 * MiB // 4), "skip.me": torch.zeros(256 * MiB // 4)}
    with flare_l2evict.evicting_from(
        tensors, race_jobs=1, l2_cache_bytes=L2, window="96MiB", exclude=["skip.*"]
    ) as report:
        assert report.source_tensor == "keep.me" and report.window_bytes == 96 * MiB
    with flare_l2evict.evicting_from(tensors, race_jobs=1, l2_cache_bytes=L2, window="1x") as bad:
        assert bad.reclaimed_bytes == 0 and "window" in (bad.reason or "")


def test_inside_a_flare_start_up_it_credits_zero_and_ends_nothing_of_the_hosts() -> None:
    host = runtime()
    assert hook(host).reclaimed_bytes == CREDIT
    hosts_own = installed()
    with flare_l2evict.evicting_from(weights(), race_jobs=2, l2_cache_bytes=L2) as report:
        assert report.reclaimed_bytes == 0 and "start-up is active" in (report.reason or "")
    assert installed() is hosts_own and seam_is_ours()  # the host's stands
    complete(host)
    assert not seam_is_ours()


@pytest.mark.parametrize("tensors", [[1, 2], None, {}], ids=["list", "none", "empty"])
def test_no_tensors_to_read_is_one_line_in_the_programs_words(tensors: object) -> None:
    with flare_l2evict.evicting_from(tensors, race_jobs=2, l2_cache_bytes=L2) as report:  # type: ignore[arg-type]
        assert report.reclaimed_bytes == 0 and not seam_is_ours()
    assert report.reason is not None and "\n" not in report.reason
    assert report.reason.startswith("evicting_from: tensors is") and "runtime." not in report.reason
    with (
        pytest.raises(L2EvictError, match=r"on_error = 'raise': evicting_from: tensors is"),
        flare_l2evict.evicting_from(tensors, race_jobs=2, on_error="raise"),  # type: ignore[arg-type]
    ):
        raise AssertionError("the block must not run")


@pytest.mark.parametrize(
    ("arguments", "start"),
    [
        ({"race_jobs": -1}, "evicting_from: race_jobs = -1; nothing changed; fix: pass race_jobs="),
        ({"race_jobs": "x"}, "evicting_from: race_jobs = 'x'"),
        ({"race_jobs": True}, "evicting_from: race_jobs = True"),
        ({"race_jobs": 10**9}, "evicting_from: race_jobs = 1000000000"),
        ({"race_jobs": 2, "l2_cache_bytes": 0}, "evicting_from: l2_cache_bytes = 0"),
        ({"race_jobs": 2, "l2_cache_bytes": "32MiB"}, "evicting_from: l2_cache_bytes = '32MiB'"),
    ],
    ids=["negative", "text", "bool", "huge", "zero-l2", "text-l2"],
)
def test_bad_arguments_are_named_in_the_programs_words(
    arguments: dict[str, object], start: str
) -> None:
    # A program passes race_jobs=, not a host's runtime: the line names its argument.
    called = {"l2_cache_bytes": L2, **arguments}
    with flare_l2evict.evicting_from(weights(), **called) as report:  # type: ignore[arg-type]
        assert report.reclaimed_bytes == 0 and not seam_is_ours()
    assert report.reason is not None and report.reason.startswith(start)
    assert "runtime." not in report.reason and "\n" not in report.reason
    with (
        pytest.raises(L2EvictError, match="on_error = 'raise': evicting_from: "),
        flare_l2evict.evicting_from(weights(), on_error="raise", **called),  # type: ignore[arg-type]
    ):
        raise AssertionError("the block must not run")
    assert not seam_is_ours() and installed() is None


def test_a_tensor_only_the_block_keeps_alive_is_not_credited() -> None:
    # Issue 28: the block once reported 64,978,432 bytes for a tensor nothing else held.
    with flare_l2evict.evicting_from(weights(), race_jobs=1, l2_cache_bytes=L2) as report:
        assert report.reclaimed_bytes == 0 and not seam_is_ours()
    assert "nothing but the plugin holds the storage" in (report.reason or "")
    assert "resident_tensors" not in (report.reason or "")


def test_the_block_keeps_only_what_the_races_read_alive() -> None:
    kept = torch.zeros(128 * MiB // 4)
    dropped = torch.zeros(MiB // 4)  # too small to be read: the program drops it
    alive = dropped.untyped_storage()._weak_ref()
    tensors = {"model.layers.0.mlp.experts.w13_weight": kept, "model.norm.weight": dropped}
    with flare_l2evict.evicting_from(tensors, race_jobs=1, l2_cache_bytes=L2) as report:
        assert report.reclaimed_bytes > 0
        del tensors, dropped
        gc.collect()
        assert torch.UntypedStorage._expired(alive)  # the block does not hold the mapping


class RaisingTextStandIn(str):
    """A program's str subclass whose every method raises."""

    def __getattribute__(self, name: str) -> object:
        raise RuntimeError(f"{name} refused")


def test_an_argument_whose_methods_raise_never_raises_on_entry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    resident = weights()
    for bad in ({"window": RaisingTextStandIn("stock")}, {"on_error": RaisingTextStandIn("x")}):
        with (
            caplog.at_level(logging.INFO, logger="flare_l2evict"),
            flare_l2evict.evicting_from(resident, race_jobs=1, l2_cache_bytes=L2, **bad) as report,  # type: ignore[arg-type]
        ):
            assert not seam_is_ours() or report.reclaimed_bytes > 0
    assert installed() is None and not seam_is_ours()


@pytest.mark.parametrize("race_jobs", [3, 1], ids=["unused-credit", "no-race-ran"])
def test_every_line_a_block_prints_names_its_own_arguments(
    race_jobs: int, caplog: pytest.LogCaptureFixture
) -> None:
    resident = weights()
    with (
        caplog.at_level(logging.INFO, logger="flare_l2evict"),
        flare_l2evict.evicting_from(resident, race_jobs=race_jobs, l2_cache_bytes=L2) as report,
    ):
        assert report.reclaimed_bytes > 0
        if race_jobs == 3:  # one race holds one eviction: race_jobs=3 credits two unused
            handle = seam()(torch.device("cpu"), enabled=True)  # type: ignore[operator]
            handle()
            del handle
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("flare_l2evict")]
    assert lines and any("UNUSED CREDIT" in x or "NO RACE RAN" in x for x in lines)
    for line in lines:
        assert "runtime" not in line and "startup_complete" not in line, line
        assert "before_first_capture" not in line, line


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
        assert report.reclaimed_bytes == 0 and installed() is None
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


@pytest.mark.parametrize(
    ("tensors", "named"),
    [
        ({"w": torch.zeros(8), "scale": 0.5}, "evicting_from's tensors must map names"),
        ({}, "pass evicting_from the tensors the program keeps resident"),
        ({3: torch.zeros(8)}, "evicting_from's tensors must map names (str)"),
        # Slices of a storage without its base: borrowed; the fix names the block's argument.
        ("borrowed", "owning storage in evicting_from's tensors"),
    ],
    ids=["non-tensor", "empty", "non-str-name", "borrowed"],
)
def test_a_bad_mapping_is_named_in_the_programs_words(
    tensors: dict[object, object] | str, named: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The device is given, so the mapping reaches the choice itself (issue 27: every line
    # a program sees names its own arguments, never the host's resident_tensors()).
    base = torch.zeros(192 * MiB // 4).untyped_storage()
    if tensors == "borrowed":
        half = 96 * MiB
        tensors = {
            f"w{i}": torch.empty(0).set_(base[i * half : (i + 1) * half], 0, (half // 4,), (1,))
            for i in range(2)
        }
    with (
        caplog.at_level(logging.INFO, logger="flare_l2evict"),
        flare_l2evict.evicting_from(
            tensors,  # type: ignore[arg-type]
            race_jobs=2,
            device="cpu",
            l2_cache_bytes=L2,
        ) as report,
    ):
        assert report.reclaimed_bytes == 0 and named in (report.reason or ""), report.reason
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("flare_l2evict")]
    for line in [*lines, report.reason or ""]:
        assert "resident_tensors" not in line and "before_first_capture" not in line, line
        assert "runtime." not in line and "startup_complete" not in line, line
    assert installed() is None


def test_a_block_dropped_before_its_exit_ends_its_start_up_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 42: as a TemporaryDirectory left uncleaned does, a block entered and dropped
    # without its exit warns (ResourceWarning) besides its WARNING line, so no test can
    # drop one and pass; one whose exit ran is dropped without a word.
    tensors = weights()
    block = flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2)
    assert block.__enter__().reclaimed_bytes == CREDIT and seam_is_ours()
    with (
        caplog.at_level(logging.WARNING, logger="flare_l2evict"),
        pytest.warns(ResourceWarning, match="an evicting_from block dropped before its exit"),
    ):
        del block
        gc.collect()
    assert not seam_is_ours() and installed() is None
    assert "dropped before its exit ran" in caplog.text
    with flare_l2evict.evicting_from(tensors, race_jobs=JOBS, l2_cache_bytes=L2) as again:
        assert again.reclaimed_bytes == CREDIT
