"""``flare-l2evict check`` on this (CPU) machine: what it says about the machine and the credit."""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.metadata
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support.checkpoints import sparse_zeros
from support.fake_b12x import use_fork_api
from support.figures import OWN, MiB
from support.json_output import parsed

from flare_l2evict._b12x.provider import provider_problem
from flare_l2evict.tools import main
from flare_l2evict.tools._inputs import DISABLED
from flare_l2evict.tools._origin import b12x_origin, judged
from flare_l2evict.tools._profiles import PROFILES
from flare_l2evict.tools.cli import check as _check


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = run(capsys, "check", "--json", *argv)
    return code, parsed("check", out)


def test_a_bare_check_says_which_device_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, out, _ = run(capsys, "check")
    lines = out.splitlines()
    first, config, versions, provider = lines[:4]
    # The file import b12x loads, under the provider line (wrapped there if it is long).
    imported = " ".join(line.strip() for line in lines[4:6] if line.startswith("    "))
    own = importlib.metadata.version("flare-l2evict")
    assert first == (
        f"flare-l2evict {own} check on cpu (default: no CUDA device here, so profile gb202 "
        "stands in)"
    )
    assert config == "config: none given: defaults apply"
    flashinfer = importlib.metadata.version("flashinfer-python")
    # b12x ships inside flashinfer-python here, with no distribution record of its own:
    # the provider line names that release, and nothing else repeats it.
    assert versions == f"torch {importlib.metadata.version('torch')}"
    assert provider.startswith(f"b12x provider: FlashInfer (flashinfer-python {flashinfer}); ")
    assert imported.startswith("import b12x loads /") and imported.endswith(".py")
    # Within 100 columns, but for a path longer than that: whole, on a line of its own.
    assert all(len(line) <= 100 or " " not in line.strip() for line in lines)
    assert out.count(flashinfer) == 1
    assert "seam: installs" in out and code == 0


def test_every_line_fits_100_columns_and_each_reason_is_given_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = sparse_zeros(tmp_path / "model.safetensors", {"w": (96 * MiB // 4,)})
    code, out, _ = run(capsys, "check", str(path), "--device", "cpu")
    lines = out.splitlines()
    assert code == 1 and all(len(line) <= 100 for line in lines), out
    reason = "no storage on this rank's checkpoint covers the 268,435,456-byte eviction window:"
    assert " ".join(out.split()).count(reason) == 1
    at = lines.index("storage read: none")
    assert lines[at + 1].startswith(f"    {reason}")
    assert lines[-1] == "verdict: falls back, credit 0 bytes (the reason above)"


def test_check_defaults_to_the_gpu_where_there_is_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def run_check_stand_in(*, device: object, device_reason: str, **_: object) -> int:
        seen.append((str(device), device_reason))
        return 0

    monkeypatch.setattr(_check, "run_check", run_check_stand_in)
    assert main(["check"]) == 0
    assert main(["check", "--device", "cpu"]) == 0
    assert seen == [("cuda:0", "default: CUDA is available here"), ("cpu", "--device")]


def test_help_says_the_default_device(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: cuda:0 when CUDA is available, else cpu" in text and "--json" in text


def test_json_holds_every_figure_and_agrees_with_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = sparse_zeros(tmp_path / "model.safetensors", {"w": (128 * MiB // 4,)})
    code, figures = check_json(capsys, str(path), "--profile", "h100", "--device", "cpu")
    assert code == 0 and figures["exit_code"] == 0
    assert {"versions", "b12x", "device", "device_reason", "l2_cache_bytes", "seam"} <= set(figures)
    assert {"stock_buffer", "window", "storage_read", "verdict", "credit_bytes", "reason"} <= set(
        figures
    )
    assert figures["b12x"]["origin"] == b12x_origin().describe()
    assert figures["seam"]["verdict"] == "installs" and figures["verdict"] == "installs"
    assert figures["window"]["bytes"] == 100 * MiB  # h100: max(2 x 50 MiB, 64 MiB)
    assert figures["storage_read"]["tensors"] == [{"name": "w", "bytes": 128 * MiB}]
    assert figures["credit_bytes"] == 5 * 100 * MiB - OWN
    main(["plan", str(path), "--profile", "h100", "--json"])
    plan = parsed("plan", capsys.readouterr().out)
    assert plan["agreed_reclaimed_bytes"] == figures["credit_bytes"]


def test_a_checkpoint_below_the_window_falls_back_with_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The report's over-credit, through check: the same shard twice is still one shard."""
    path = sparse_zeros(tmp_path / "model.safetensors", {"w": (96 * MiB // 4,)})
    (tmp_path / "link.safetensors").symlink_to(path)
    for argv in ([path], [path, path], [path, tmp_path / "link.safetensors"]):
        code, figures = check_json(capsys, *map(str, argv), "--l2-mib", "64", "--device", "cpu")
        assert code == 1 and figures["verdict"] == "falls back"
        assert figures["credit_bytes"] == 0
        assert figures["reason"] == (
            "no storage on this rank's checkpoint covers the 134,217,728-byte eviction window: "
            f"1 eligible storage holds {96 * MiB:,} distinct bytes; stock b12x keeps its own buffer"
        )


# --- where b12x comes from --------------------------------------------------------------


def _record(info: Path, files: dict[str, bytes]) -> None:
    rows = []
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(content)}")
    rows += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def install(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """A distribution record as pip leaves one: METADATA and RECORD (with hashes)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    _record(info, files)


STANDALONE = b'"""b12x"""\n'
SHIM = b'"""Load the embedded implementation without initializing FlashInfer."""\n'


def use_site(monkeypatch: pytest.MonkeyPatch, site: Path, init: bytes | None) -> None:
    """Hide the environment's b12x; ``site`` comes first on sys.path with this b12x/__init__.py."""
    for name in list(sys.modules):
        if name == "b12x" or name.startswith("b12x."):
            monkeypatch.delitem(sys.modules, name)
    if init is not None:
        (site / "b12x").mkdir(parents=True, exist_ok=True)
        (site / "b12x" / "__init__.py").write_bytes(init)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()


def test_a_standalone_b12x_is_named_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path, "b12x", "1.5.1", {"b12x/__init__.py": STANDALONE})
    use_site(monkeypatch, tmp_path, STANDALONE)
    origin = b12x_origin()
    assert origin.describe() == "standalone b12x 1.5.1"
    assert origin.path == str(tmp_path / "b12x" / "__init__.py")


@pytest.mark.parametrize(
    ("content", "owner"),
    [(STANDALONE, "standalone b12x 1.5.1"), (SHIM, "flashinfer-python 0.7.4")],
)
def test_two_records_of_one_file_are_told_apart_by_its_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, owner: str
) -> None:
    """Both installed: the one installed last wrote b12x/__init__.py, and its hash says which."""
    install(tmp_path, "b12x", "1.5.1", {"b12x/__init__.py": STANDALONE})
    install(tmp_path, "flashinfer-python", "0.7.4", {"b12x/__init__.py": SHIM})
    use_site(monkeypatch, tmp_path, content)
    assert b12x_origin().describe() == owner


def test_a_b12x_no_distribution_owns_is_named_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_site(monkeypatch, tmp_path, STANDALONE)
    origin = b12x_origin()
    assert (origin.distribution, origin.version) == (None, None)
    assert origin.describe().endswith("b12x/__init__.py (no installed distribution owns it)")


def test_no_b12x_is_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "b12x", None)
    assert b12x_origin().describe() == "not importable"


# --- the provider line and the judged table ----------------------------------------------


def test_the_provider_line_names_flashinfer_and_its_judged_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flashinfer = importlib.metadata.version("flashinfer-python")
    row = judged("flashinfer-python", flashinfer)
    assert row is not None, f"flashinfer-python {flashinfer} has no judged row"
    code, out, _ = run(capsys, "check", "--device", "cpu")
    verdict = "installs" if row.installs else "falls back"
    assert code == (0 if row.installs else 1)
    assert (
        f"b12x provider: FlashInfer (flashinfer-python {flashinfer}); judged table: {verdict}"
        in (out.splitlines())
    )
    assert (
        "supported: flashinfer-python>=0.7.2 or b12x>=1.5 (or a fork with use_startup_eviction); "
        "torch>=2.4"
    ) in out.splitlines()
    _, figures = check_json(capsys, "--device", "cpu")
    assert figures["b12x"]["provider"] == "FlashInfer" and figures["b12x"]["judged"] == verdict


@pytest.mark.parametrize(
    ("version", "table"),
    [
        ("1.5.1", "judged table: installs"),
        ("1.3.0", "judged table: falls back"),
        ("1.5.9", "not in the judged table: the seam proof below judges it"),
    ],
)
def test_a_standalone_b12x_is_looked_up_in_the_table(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    version: str,
    table: str,
) -> None:
    """A standalone b12x stand-in (its record and an __init__.py, no preparation package)."""
    install(tmp_path, "b12x", version, {"b12x/__init__.py": STANDALONE})
    use_site(monkeypatch, tmp_path, STANDALONE)
    code, out, _ = run(capsys, "check", "--device", "cpu")
    assert f"b12x provider: standalone (b12x {version}); {table}" in out.splitlines()
    # The stand-in has no races: the proof refuses it, whatever the table says.
    lines = out.splitlines()
    assert code == 1 and lines[lines.index("seam: falls back") + 1].startswith("    b12x ")
    assert all(len(line) <= 100 or " " not in line.strip() for line in lines)  # a path: whole


def test_no_b12x_names_what_was_found_and_what_is_needed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``import b12x`` blocked: sys.modules' None stands in for an environment without b12x."""
    for name in list(sys.modules):
        if name == "b12x" or name.startswith("b12x."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "b12x", None)
    line = provider_problem()
    assert line is not None
    code, figures = check_json(capsys, "--device", "cpu")
    assert code == 1 and figures["b12x"]["provider"] == "none"
    assert figures["seam"]["reason"] == line and figures["reason"] == line
    code, out, _ = run(capsys, "check", "--device", "cpu")
    assert "b12x provider: none (no release); nothing to judge" in out.splitlines()


def test_the_fork_is_named_as_the_provider(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_fork_api(monkeypatch, lambda storage: None)
    code, out, _ = run(capsys, "check", "--device", "cpu")
    provider = next(line for line in out.splitlines() if line.startswith("b12x provider:"))
    assert provider.startswith("b12x provider: fork (flashinfer-python ")
    assert "with the fork's use_startup_eviction" in provider and code == 0
    assert all(len(line) <= 100 for line in out.splitlines())


def test_persisting_l2_is_not_applicable_on_a_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "check", "--device", "cpu")
    assert "persisting L2: not applicable on cpu (a CUDA carve-out)" in out.splitlines()
    _, figures = check_json(capsys, "--device", "cpu")
    expected = {"applicable": False, "bytes": None, "via": None, "fault": None}
    assert figures["persisting_l2"] == expected


@pytest.mark.parametrize("with_checkpoint", [False, True])
def test_disabled_by_config_is_one_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], with_checkpoint: bool
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text("[plugins.l2evict]\nenabled = false\n")
    argv = ["--config", str(config), "--device", "cpu"]
    if with_checkpoint:
        argv.append(str(sparse_zeros(tmp_path / "model.safetensors", {"w": (128 * MiB,)})))
    code, figures = check_json(capsys, *argv)
    # The operator's choice, not a fault: exit 0 (issue 29), with the one reason.
    assert code == 0 and figures["reason"] == DISABLED and figures["verdict"] == "disabled"
    assert figures["credit_bytes"] == 0
    assert DISABLED == "disabled by config (plugins.l2evict.enabled = false)"


def test_check_takes_plain_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """``run_check`` needs no argparse object: a program calls it with values."""
    code = _check.run_check(
        device=torch.device("cpu"),
        device_reason="a caller",
        profile=PROFILES["h200"],
        as_json=True,
    )
    figures = parsed("check", capsys.readouterr().out)
    assert code == 0 and figures["device_reason"] == "a caller"
    assert figures["window"]["bytes"] == 120 * MiB and figures["race_jobs"] == 5


# --- on a GPU ---------------------------------------------------------------------------


def _set_persisting_limit(nbytes: int) -> int:
    """Set this process's cudaLimitPersistingL2CacheSize; returns what the device kept."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart
    limit = cudart.cudaLimit.cudaLimitPersistingL2CacheSize
    (error,) = cudart.cudaDeviceSetLimit(limit, nbytes)
    assert error == cudart.cudaError_t.cudaSuccess, error
    error, kept = cudart.cudaDeviceGetLimit(limit)
    assert error == cudart.cudaError_t.cudaSuccess, error
    return int(kept)


@pytest.mark.gpu
def test_gpu_check_prints_the_provider_and_persisting_l2_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.cuda.synchronize()  # this process has its CUDA context
    _set_persisting_limit(0)
    _, out, _ = run(capsys, "check", "--device", "cuda:0")
    lines = out.splitlines()
    print("\n".join(lines), file=sys.stderr)  # the lines for the closing note
    assert any(line.startswith("b12x provider: ") for line in lines)
    at = lines.index("persisting L2 carve-out: 0 bytes: every L2 line can be evicted")
    assert lines[at + 1].startswith("    (cudaLimitPersistingL2CacheSize, read via ")
    assert all(len(line) <= 100 for line in lines)


@pytest.mark.gpu
def test_gpu_a_persisting_carve_out_is_named_with_its_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.cuda.synchronize()  # this process has its CUDA context
    kept = _set_persisting_limit(4 * MiB)
    try:
        assert kept > 0, "this GPU keeps no persisting-L2 carve-out"
        _, figures = check_json(capsys, "--device", "cuda:0")
        assert figures["persisting_l2"]["bytes"] == kept
        _, out, _ = run(capsys, "check", "--device", "cuda:0")
        lines = out.splitlines()
        at = next(i for i, x in enumerate(lines) if x.startswith("persisting L2 carve-out:"))
        line = " ".join(lines[at].split())
        detail = []
        for below in lines[at + 1 :]:
            if not below.startswith("    "):
                break
            detail.append(below.strip())
        print("\n".join(lines[at : at + 1 + len(detail)]), file=sys.stderr)
        # Information, not a fault (issue 29): the verdict and exit code are the set-aside-free
        # ones, and the line says when to act instead of crying wolf.
        assert (
            line == f"persisting L2 carve-out: {kept:,} bytes set aside (information, not a fault)"
        )
        said = " ".join(detail)
        assert "survive stock's eviction and the plugin's read alike" in said
        assert "act only if the server marks lines persisting and wants its races cold" in said
        assert "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0)" in said
        assert "fix:" not in said and "warm" not in line
        assert all(len(x) <= 100 for x in lines)
        assert figures["exit_code"] == 0 and figures["verdict"] == "installs if"
    finally:
        _set_persisting_limit(0)


@pytest.mark.gpu
def test_gpu_check_exits_0_with_the_machines_default_set_aside(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A fresh process's own limit (11,796,480 bytes on the H200s here): exit 0, no warning."""
    done = subprocess.run(
        [sys.executable, "-m", "flare_l2evict", "check"], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    print(done.stdout, file=sys.stderr)  # check's output, for the closing note
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr and "warm" not in done.stdout
    assert "verdict: installs only if this rank" in done.stdout


@pytest.mark.gpu
def test_gpu_check_races_agrees_with_stock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    began = time.perf_counter()
    code, out, err = run(capsys, "check", "--races")
    wall = time.perf_counter() - began
    with capsys.disabled():  # the figures for BENCHMARKS.md, not an assertion
        print(out + f"wall time: {wall:.1f} s", file=sys.stderr)
    assert code == 0, out + err
    assert "races: verdict: agrees with stock" in out
    code, figures = check_json(capsys, "--races")
    races = figures["races"]
    assert code == 0 and races["agrees"] and races["reason"] is None
    assert races["changed"]["plugin"] <= races["changed"]["stock_rerun"]
    # The plugin's races allocate no eviction buffer; stock's allocate one per race.
    assert races["peak_bytes"]["plugin"] < figures["stock_buffer"]["bytes"] // 8
    assert races["peak_bytes"]["stock"] >= figures["stock_buffer"]["bytes"]


# --- check --races, off the GPU -----------------------------------------------------------


def test_races_without_a_cuda_device_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for argv in (["check", "--races"], ["check", "--races", "--device", "cpu"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", argv
        (line,) = err.splitlines()
        assert "--races runs b12x's races on a CUDA device" in line and "; fix: " in line


def _agreement(stock: list[float], plugin: list[float], rerun: list[float]) -> Any:
    """The judgement of one race's latencies per arm (both repeats alike)."""
    from flare_l2evict.tools._races_check import RaceAgreement, _judge

    result = RaceAgreement(races=1, repeats=2)
    seen = {"stock": stock, "plugin": plugin, "stock_rerun": rerun}
    _judge(result, {arm: [[tuple(lat)], [tuple(lat)]] for arm, lat in seen.items()})
    return result


def test_races_agree_where_the_plugin_changes_no_more_winners_than_stocks_rerun() -> None:
    same = _agreement([10.0, 14.0], [10.1, 14.2], [10.0, 13.9])
    assert same.agrees and same.changed == {"plugin": 0, "stock_rerun": 0}
    # A near-tie that flips (within 1% under stock's timings) is no change.
    tie = _agreement([10.0, 10.05], [10.2, 10.1], [10.0, 10.05])
    assert tie.agrees and tie.changed["plugin"] == 0 and tie.winners["plugin"] == [[1], [1]]
    # A warm eviction picks the other candidate, which costs 40% under stock's timings.
    warm = _agreement([10.0, 14.0], [9.0, 7.0], [10.1, 14.1])
    assert not warm.agrees and warm.changed == {"plugin": 2, "stock_rerun": 0}
    assert warm.max_regret["plugin"] == pytest.approx(0.4)
    # Where stock's own re-run flips as far, the plugin's flip is within what races do.
    noisy = _agreement([10.0, 14.0], [9.0, 7.0], [15.0, 7.0])
    assert noisy.agrees


@pytest.mark.parametrize(
    ("command", "with_checkpoint"), [("check", False), ("check", True), ("plan", True)]
)
def test_zero_race_jobs_is_told_to_pass_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, with_checkpoint: bool
) -> None:
    # Issue 46: the fix named runtime.race_jobs, a host's value, to an operator at a flag.
    # 512 MiB: more than the stock window, so 0 race jobs is the reason.
    path = sparse_zeros(tmp_path / "model.safetensors", {"w": (512 * MiB // 4,)})
    given = [str(path)] if with_checkpoint else []
    code, out, _ = run(capsys, command, "--race-jobs", "0", *given)
    said = " ".join(out.split())
    assert code == 1 and "runtime.race_jobs" not in said, out
    assert (
        "nothing to reclaim: the host runs 0 race jobs; fix: pass --race-jobs J, the b12x" in said
    )
