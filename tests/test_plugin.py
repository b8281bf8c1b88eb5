"""The plugin through real pluggy and the installed entry point, on the reference host.

What a host's runtime values and calls do to the hook is in ``test_host_values.py`` and
``test_host_calls.py``.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from support.figures import KV_BYTES_PER_TOKEN as KV, OUTPUTS, OWN, MiB
from support.hosts import CREDIT, hook, runtime, seam_is_ours
from support.startups import installed

import flare_l2evict
from flare_l2evict import L2EvictError, PluginNotFoundError, _core
from flare_l2evict._eviction import WeightEviction
from flare_l2evict.tools.reference_host import (
    PROFILES,
    DeviceProfile,
    ReferenceHost,
    StartupArm,
    example_tensors,
    installed_plugins,
    plugin_manager,
    write_example_checkpoint,
)

GB202 = PROFILES["gb202"]
measurement = pytest.importorskip("b12x.preparation._measurement")


def host(
    plugins: tuple[str, ...] = ("l2evict",),
    config: Mapping[str, Any] | None = None,
    profile: DeviceProfile = GB202,
) -> ReferenceHost:
    return ReferenceHost(plugins=plugins, config=config, profile=profile, kv_bytes_per_token=KV)


@pytest.fixture(scope="module")
def gb202_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded example for GB202's 256 MiB window: its tensors' zeros as a sparse hole."""
    return write_example_checkpoint(tmp_path_factory.mktemp("ckpt"), 256 * MiB)


@pytest.fixture(scope="module")
def without_plugins(gb202_checkpoint: Path) -> StartupArm:
    """The GB202 start-up with no plugin named: stock's figures, which three tests compare."""
    return host(plugins=()).start(gb202_checkpoint)


def test_entry_point_is_installed_and_loaded_by_name() -> None:
    assert "l2evict" in installed_plugins()
    pm = plugin_manager(["l2evict"])
    assert pm.get_plugin("l2evict") is flare_l2evict.plugin
    assert plugin_manager([]).get_plugins() == set()


def test_seed_shape_on_gb202(gb202_checkpoint: Path, without_plugins: StartupArm) -> None:
    without = without_plugins
    with_plugin = host().start(gb202_checkpoint)
    assert without.eviction_storage_bytes == 5 * 256 * MiB == 1_342_177_280
    assert with_plugin.eviction_storage_bytes == OUTPUTS  # its own outputs, nothing per job
    # Less the eviction's own outputs and its kernel's code, once: a lower bound.
    assert with_plugin.reclaimed_bytes == 1_342_177_280 - OWN
    gained = with_plugin.kv_budget_bytes - without.kv_budget_bytes
    assert gained == 1_342_177_280 - OWN
    assert with_plugin.kv_tokens - without.kv_tokens == pytest.approx(gained / KV, abs=1)
    report = with_plugin.report
    assert report is not None and report.mechanism == "stock-seam"
    assert report.source_tensor == "model.layers.3.mlp.experts.w13_weight"
    assert report.window_bytes == 256 * MiB


def test_source_is_named_before_the_first_race_job(gb202_checkpoint: Path) -> None:
    reference = host()
    result = reference.start(gb202_checkpoint)
    events = reference.events
    assert events.index("before_first_capture") < events.index("race job 0 starts")
    assert result.job_evictions == ("weights",) * GB202.race_jobs
    assert events[-1] == "startup_complete"
    assert measurement._l2_flush_fn.__name__ == "_l2_flush_fn"
    assert not hasattr(measurement._l2_flush_fn, "__flare_l2evict__")


def test_no_reference_to_the_weights_after_startup() -> None:
    from torch.multiprocessing.reductions import StorageWeakRef

    tensors = example_tensors(64 * MiB)
    big = StorageWeakRef(  # type: ignore[no-untyped-call]
        tensors["model.layers.3.mlp.experts.w13_weight"].untyped_storage()
    )
    small_l2 = dataclasses.replace(GB202, l2_cache_bytes=32 * MiB)
    result = host(profile=small_l2).start(tensors)
    assert result.reclaimed_bytes == 5 * 64 * MiB - OWN
    del tensors
    gc.collect()
    assert big.expired()  # type: ignore[no-untyped-call]


def test_disabled_by_config_leaves_the_budget(
    gb202_checkpoint: Path, without_plugins: StartupArm
) -> None:
    without = without_plugins
    off = host(config={"plugins": {"l2evict": {"enabled": False}}}).start(gb202_checkpoint)
    assert off.kv_budget_bytes == without.kv_budget_bytes
    assert off.report is not None and off.report.reason is not None
    assert off.report.reason.startswith("disabled by config")


def test_not_named_by_plugin_flag_leaves_the_budget(without_plugins: StartupArm) -> None:
    assert without_plugins.report is None


def test_unknown_plugin_is_a_clear_error() -> None:
    with pytest.raises(PluginNotFoundError, match=r"--plugin l2evcit: .*installed: .*l2evict"):
        host(plugins=("l2evcit",))


def test_on_error_raise_restores_then_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_allocator_stand_in(*_a: object, **_k: object) -> None:
        raise RuntimeError("torch said no")

    monkeypatch.setattr(WeightEviction, "__init__", broken_allocator_stand_in)
    host_runtime = runtime(
        tensors={"w": torch.zeros(1 << 25)}, config={"plugins": {"l2evict": {"on_error": "raise"}}}
    )
    with pytest.raises(L2EvictError, match=r"on_error = 'raise'.*torch said no"):
        hook(host_runtime)
    assert installed() is None
    assert host_runtime.kv_allocator.reclaimed_bytes == 0


@pytest.mark.parametrize("on_error", ["fallback", "raise"])
def test_an_error_of_the_plugins_own_falls_back_to_stock(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, on_error: str
) -> None:
    # The last guard: a fault outside every step's own (a bug of the plugin, here standing in
    # for the whole start-up's run) still gives stock b12x, 0 bytes and one line.
    def internal_fault_stand_in(*_a: object, **_k: object) -> None:
        raise RuntimeError("a bug of the plugin's own")

    monkeypatch.setattr(_core, "_run", internal_fault_stand_in)
    host_runtime = runtime(config={"plugins": {"l2evict": {"on_error": on_error}}})
    reason = "internal error in flare_l2evict (RuntimeError: a bug of the plugin's own)"
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        if on_error == "raise":
            with pytest.raises(L2EvictError, match=r"on_error = 'raise'") as raised:
                hook(host_runtime)
            assert reason in str(raised.value) and "\n" not in str(raised.value)
        else:
            report = hook(host_runtime)
            assert report.reclaimed_bytes == 0 and (report.reason or "").startswith(reason)
            (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
            assert line.levelno == logging.WARNING and reason in line.getMessage()
    assert installed() is None and not seam_is_ours()
    assert host_runtime.kv_allocator.reclaimed_bytes == 0


def test_install_line_names_tensor_device_and_bytes(caplog: pytest.LogCaptureFixture) -> None:
    host_runtime = runtime(tensors={"model.layers.0.w": torch.zeros(1 << 25)})
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        hook(host_runtime)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "'model.layers.0.w'" in line and "on cpu" in line
    assert f"{CREDIT:,} bytes" in line
