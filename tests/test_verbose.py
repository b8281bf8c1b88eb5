"""``-v``: the decision's lines on stderr, a few for each step, whatever the tensor count.

Each command runs twice on one checkpoint of 2,001 tensors, one of them excluded:
without ``-v`` and with it. Stdout is the same; what ``-v`` adds is DEBUG lines
only, each naming its step (the seam proof, the basis, the decision, what is
read, the time of each step), bounded in count and length: the storages beyond
the first few are counted, not listed.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flare_l2evict._decision import Storages, choose_regions
from flare_l2evict.tools import main

MiB = 1 << 20
SMALL = 2_000


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One checkpoint for the module (170 MiB in 2,002 tensors); the commands only read it."""
    from safetensors.torch import save_file

    tensors = {f"model.layers.{i}.norm.weight": torch.zeros(64) for i in range(SMALL)}
    tensors["model.embed_tokens.weight"] = torch.zeros(80 * MiB // 4)
    tensors["lm_head.weight"] = torch.zeros(90 * MiB // 4)
    path = tmp_path_factory.mktemp("verbose") / "model.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verbose-config") / "deploy.toml"
    path.write_text('[plugins.l2evict]\nexclude = ["lm_head*"]\n')
    return path


def _added(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    """The lines ``-v`` adds to stderr; stdout and the exit code are checked unchanged."""
    code = main(argv)
    out, err = capsys.readouterr()
    code_v = main([*argv, "-v"])
    out_v, err_v = capsys.readouterr()
    assert (code_v, out_v) == (code, out)
    quiet = err.splitlines()
    assert "DEBUG" not in err
    assert all(line in err_v.splitlines() for line in quiet)
    added = [line for line in err_v.splitlines() if line not in quiet]
    # The plugin's lines, and the command's own (startup names the profile it stands in with).
    assert all(line.startswith(("DEBUG flare_l2evict: ", "DEBUG flare-l2evict ")) for line in added)
    assert len(added) <= 12 and all(len(line) <= 1500 for line in added), added
    return added


def _has(lines: list[str], *phrases: str) -> None:
    for phrase in phrases:
        assert any(phrase in line for line in lines), (phrase, lines)


def _decision(lines: list[str], where: str) -> None:
    _has(
        lines,
        # The storages considered, largest first: the first few, the rest counted.
        f"decision on {where}: {SMALL + 2:,} tensors in {SMALL + 2:,} storages, largest first: "
        f"'lm_head.weight' {90 * MiB:,} B: excluded; 'model.embed_tokens.weight' {80 * MiB:,} "
        f"B: read {64 * MiB:,} B; ",
        f"; {SMALL + 2 - 5:,} more storages not listed",
        f"decision on {where}: skipped: 1 excluded ('lm_head.weight'); reads {64 * MiB:,} bytes "
        f"of the {64 * MiB:,}-byte window",
    )


def test_startup_v_shows_the_seam_the_basis_the_decision_and_each_steps_time(
    capsys: pytest.CaptureFixture[str], model: Path, config: Path
) -> None:
    added = _added(
        capsys,
        ["startup", str(model), "--plugin", "l2evict", "--config", str(config), "--l2-mib", "16"],
    )
    _has(
        added,
        "seam on cpu: stock b12x",
        "_l2_flush_fn proved in 1 loaded module(s) (its callers look it up when they run)",
        f"basis: stock buffer {64 * MiB:,} bytes per race job (",
        f"window {64 * MiB:,} bytes (stock), L2 {16 * MiB:,} bytes (the caller's figure), 5 "
        "race jobs",
        # Issue 41: the caller's figure is the profile's, and startup says so.
        f"the gb202 profile stands in for the device: L2 {16 * MiB:,} bytes (passed as "
        "runtime.l2_cache_bytes)",
        "startup's before_first_capture took ",
    )
    _decision(added, "cpu")
    (steps,) = [line for line in added if "before_first_capture took" in line]
    assert all(f"{step} " in steps for step in ("seam", "source", "install", "agree", "total"))


def test_check_v_shows_the_seam_the_basis_the_decision_and_each_steps_time(
    capsys: pytest.CaptureFixture[str], model: Path, config: Path
) -> None:
    added = _added(
        capsys, ["check", str(model), "--device", "cpu", "--config", str(config), "--l2-mib", "16"]
    )
    _has(added, "seam on cpu: stock b12x", f"window {64 * MiB:,} bytes (stock)")
    _decision(added, "this rank's checkpoint")
    _has(added, "check took provider ", "basis ", "decision ")


def test_plan_v_shows_the_basis_each_ranks_decision_and_the_time(
    capsys: pytest.CaptureFixture[str], model: Path, config: Path
) -> None:
    added = _added(capsys, ["plan", str(model), "--config", str(config), "--l2-mib", "16"])
    _has(
        added,
        f"plan's basis: stock buffer {64 * MiB:,} bytes per race job",
        "plan: rank 0's decision",
        "plan took headers ",
    )
    _decision(added, "this rank's checkpoint")


def test_skipped_storages_are_counted_by_reason_with_a_few_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Borrowed, file-mapped and other-device skips at 10,000 tensors: two lines, counted."""
    n = 10_000
    names = [f"w{i:05d}" for i in range(n)]
    skips: list[str | None] = ["borrowed" if i % 2 else "other device" for i in range(n - 2)]
    skips += ["file-mapped", None]
    sizes = [4096] * (n - 1) + [1 << 20]
    starts = [i * (1 << 21) for i in range(n)]
    with caplog.at_level(logging.DEBUG, logger="flare_l2evict.decision"):
        choose_regions(Storages(names, sizes, starts, skips), 1 << 20, where="cuda:0")
    lines = caplog.messages
    assert len(lines) == 2
    assert lines[0].startswith(
        f"flare_l2evict: decision on cuda:0: {n:,} tensors in {n:,} storages, largest first: "
        f"'w09999' {1 << 20:,} B: read {1 << 20:,} B; 'w00000' 4,096 B: other device; 'w00001' "
        "4,096 B: borrowed;"
    )
    assert lines[0].endswith(f"; {n - 5:,} more storages not listed")
    assert lines[1] == (
        "flare_l2evict: decision on cuda:0: skipped: 4,999 other device ('w00000', 'w00002', "
        "'w00004' and 4,996 more), 4,999 borrowed ('w00001', 'w00003', 'w00005' and 4,996 more), "
        "1 file-mapped ('w09998'); reads 1,048,576 bytes of the 1,048,576-byte window"
    )


@pytest.mark.slow  # a fresh interpreter of the command line
def test_the_console_command_routes_debug_to_stderr(model: Path) -> None:
    """As an operator runs it: a fresh ``python -m flare_l2evict``, its DEBUG lines on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "flare_l2evict", "plan", str(model), "--l2-mib", "16", "-v"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    debug = [line for line in done.stderr.splitlines() if line.startswith("DEBUG flare_l2evict: ")]
    assert len(debug) == len(done.stderr.splitlines()) == 5, done.stderr
    assert "DEBUG" not in done.stdout
