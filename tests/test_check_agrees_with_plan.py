"""``check`` says what it checked: given a checkpoint it agrees with ``plan`` on it; without one it
names the condition ``plan`` then tests, and never an unqualified ``installs`` (issue 41).

Real safetensors files, the real header reader, ``check``'s own steps on this CPU (the seam
proof of the installed b12x, stock's buffer measured) and ``plan``'s decision.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, strategies as st
from safetensors.torch import save_file
from support.checkpoints import SECTION, SIZES, names, property_test, section
from support.figures import KV_BYTES_PER_TOKEN as KV
from support.json_output import parsed

from flare_l2evict.tools import main
from flare_l2evict.tools._headers import TensorHeader, read_checkpoint
from flare_l2evict.tools._inputs import settings_from_config
from flare_l2evict.tools._plan import plan_ranks, shard_of
from flare_l2evict.tools._preflight import window_condition
from flare_l2evict.tools.cli.check import run_check
from flare_l2evict.tools.reference_host import PROFILES

pytest.importorskip("b12x.preparation._measurement")

checkpoints = st.dictionaries(names, st.sampled_from(SIZES), min_size=1, max_size=6)


def _check(
    capsys: pytest.CaptureFixture[str],
    config: dict[str, Any],
    race_jobs: int,
    headers: list[TensorHeader] | None,
) -> dict[str, Any]:
    profile = dataclasses.replace(PROFILES["h100"], race_jobs=race_jobs)
    code = run_check(
        device=torch.device("cpu"),
        device_reason="--device",
        profile=profile,
        settings=settings_from_config(config),
        headers=headers,
        as_json=True,
    )
    figures = parsed("check", capsys.readouterr().out)
    assert figures["exit_code"] == code
    return figures


@pytest.mark.slow  # a property test: 40 examples, each a checkpoint written and checked twice
@property_test(40)
@given(sizes=checkpoints, **SECTION)
def test_check_agrees_with_plan_and_without_the_checkpoint_names_what_plan_tests(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    sizes: dict[str, int],
    window_kib: int,
    exclude: list[str],
    race_jobs: int,
    enabled: bool,
) -> None:
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_file({name: torch.ones(n // 4) for name, n in sizes.items()}, str(path))
    config = section(window_kib, exclude, enabled)
    headers = read_checkpoint([path])
    (rank,) = plan_ranks(
        [shard_of(headers)],
        settings_from_config(config),
        l2_cache_bytes=PROFILES["h100"].l2_cache_bytes,
        race_jobs=race_jobs,
        kv_bytes_per_token=KV,
    )
    given_it = _check(capsys, config, race_jobs, headers)
    without = _check(capsys, config, race_jobs, None)

    # With the checkpoint: plan's answer, to the byte and the reason.
    assert given_it["condition"] is None
    assert given_it["credit_bytes"] == rank.reclaimed_bytes
    if not enabled:
        assert given_it["verdict"] == without["verdict"] == "disabled"
        return
    assert given_it["verdict"] == ("installs" if rank.reclaimed_bytes else "falls back")
    assert given_it["reason"] == rank.reason
    # Without it: never "installs"; the condition is the window plan tests, and nothing else
    # stands between them.
    assert without["verdict"] in ("installs if", "falls back")
    if without["verdict"] == "falls back":
        assert rank.reclaimed_bytes == 0
        return
    assert without["condition"] == window_condition(rank.window_bytes)
    assert without["window"]["bytes"] == rank.window_bytes
    if rank.reclaimed_bytes:
        assert without["credit_bytes"] == rank.reclaimed_bytes
    else:  # the weights failed the one condition named: the window is not covered
        assert rank.reason is not None and f"{rank.window_bytes:,}-byte" in rank.reason


def test_a_bare_check_never_says_installs_unqualified(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "--device", "cpu"])
    out = capsys.readouterr().out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert code == 0
    assert verdict == (
        "verdict: installs only if this rank's weights cover the window; credit 1,340,046,848 bytes"
    )
    assert "not checked: this rank's resident weights must cover the 268,435,456-byte window" in (
        " ".join(out.split())
    )


def test_a_window_no_device_memory_could_hold_falls_back_as_plan_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text('[plugins.l2evict]\nwindow = "2GiB"\n')
    code = main(["check", "--device", "cpu", "--memory-gib", "1", "--config", str(config)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1
    assert "verdict: falls back, credit 0 bytes" in out
    assert (
        "the 2,147,483,648-byte eviction window is larger than the device's 1,073,741,824 bytes "
        "of memory, so no resident weights can cover it" in out
    )


def test_json_without_a_checkpoint_says_so_in_a_field_a_script_can_test(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["check", "--device", "cpu", "--json", "--l2-mib", "4096"])
    figures = parsed("check", capsys.readouterr().out)
    assert code == figures["exit_code"] == 0
    assert figures["verdict"] == "installs if"
    assert figures["condition"] == window_condition(8 << 30)
    assert figures["storage_read"] == {"checked": False, "read_bytes": None, "tensors": None}
