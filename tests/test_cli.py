"""The console entry point, as an operator runs it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from figures import OUTPUTS, OWN, MiB

from flare_l2evict.tools._cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_demo_prints_the_side_by_side_table(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        code, out, _ = run(capsys, "startup", "--plugin", "l2evict", "--profile", "h100")
    assert code == 0
    assert "L2 eviction storage" in out and "5 x 100 MiB" in out
    assert f"{OUTPUTS:,} B (reads weights)" in out
    reclaimed = 5 * 100 * MiB - OWN
    assert "Reclaimed (report)" in out and f"{reclaimed:,} B" in out
    assert f"flare_l2evict: reclaimed {reclaimed:,} bytes on cpu" in caplog.text


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "startup", "--plugin", "l2evict", "--profile", "h100", "--json")
    assert code == 0
    data = json.loads(out)
    gained = data["with"]["kv_budget_bytes"] - data["without"]["kv_budget_bytes"]
    assert gained == data["with"]["report"]["reclaimed_bytes"] == 5 * 100 * MiB - OWN


def test_own_checkpoint_and_config(
    capsys: pytest.CaptureFixture[str], write_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    path = write_checkpoint({"a": torch.zeros(80 * MiB // 4), "b": torch.zeros(90 * MiB // 4)})
    config = tmp_path / "deploy.toml"
    config.write_text('[plugins.l2evict]\nexclude = ["b"]\n')
    code, out, _ = run(
        capsys, "startup", str(path), "--plugin", "l2evict", "--config", str(config),
        "--l2-mib", "16", "--race-jobs", "3", "--json",
    )  # fmt: skip
    assert code == 0
    report = json.loads(out)["with"]["report"]
    assert report["source_tensor"] == "a"
    assert report["reclaimed_bytes"] == 3 * 64 * MiB - OWN


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such checkpoint"),
        ("junk", "not a readable safetensors file"),
        ("truncated", "not a readable safetensors file"),
    ],
)
def test_bad_checkpoints_are_one_line(
    capsys: pytest.CaptureFixture[str],
    write_checkpoint: Callable[..., Path],
    tmp_path: Path,
    setup: str,
    message: str,
) -> None:
    path = tmp_path / "model.safetensors"
    if setup == "junk":
        path.write_bytes(b"this is not a safetensors file at all")
    elif setup == "truncated":
        data = write_checkpoint({"w": torch.zeros(1000)}).read_bytes()
        path.write_bytes(data[:-100])
    code, out, err = run(capsys, "startup", str(path), "--plugin", "l2evict")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_config_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text("[plugins.l2evict]\nwindow = -5\n")
    code, _, err = run(capsys, "startup", "--plugin", "l2evict", "--config", str(config))
    assert code == 2
    assert err.startswith("error: plugins.l2evict.window = -5 is invalid: use 'stock'")


def test_unknown_plugin_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "startup", "--plugin", "nope", "--profile", "h100")
    assert code == 2 and "--plugin nope: no such flare plugin is installed" in err


def test_cuda_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run(capsys, "startup", "--device", "cuda:0")
    assert code == 2 and "CUDA is not available here; fix: --device cpu" in err


def test_python_dash_m_and_console_script() -> None:
    for command in ([sys.executable, "-m", "flare_l2evict", "--help"], ["flare-l2evict", "--help"]):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert "startup" in done.stdout


def test_bench_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run(capsys, "bench")
    assert code == 2 and "bench needs a CUDA device" in err and err.count("\n") == 1


def _modules_after(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(done.stdout.split())


def test_the_plugin_entry_point_imports_only_runtime_modules() -> None:
    loaded = _modules_after("import flare_l2evict.plugin")
    ours = {m for m in loaded if m.startswith("flare_l2evict")}
    assert "flare_l2evict.plugin" in ours
    assert not {m for m in ours if m.startswith("flare_l2evict.tools")}


def test_help_parses_before_importing_torch() -> None:
    loaded = _modules_after(
        "from flare_l2evict.tools._cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert "torch" not in loaded and "flare_l2evict.tools.reference_host" not in loaded
