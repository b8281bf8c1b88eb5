"""The console entry point, as an operator runs it.

Among the cases: ``example --out`` into a directory holding symlinks or hard
links named as its files -> refused, nothing written through them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from subprocess import PIPE

import pytest
import torch
from support.checkpoints import sparse_zeros
from support.figures import OUTPUTS, OWN, MiB
from support.json_output import parsed
from support.stderr import the_error

from flare_l2evict import L2EvictError
from flare_l2evict._text import shown
from flare_l2evict.tools.cli import main
from flare_l2evict.tools.cli._shared import error_line, fix_for

H100_DEMO = ["startup", "--plugin", "l2evict", "--profile", "h100"]
"""The side-by-side demo on the h100 profile, which several tests read."""


@pytest.fixture(scope="module")
def h100_demo() -> tuple[int, str, str]:
    """The demo's exit code, stdout and stderr, run once for the module (in-process)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(H100_DEMO)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def h100_json() -> tuple[int, str]:
    """The demo's ``--json`` exit code and stdout, run once for the module (in-process)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main([*H100_DEMO, "--json"])
    return code, out.getvalue()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_demo_prints_the_side_by_side_table(h100_demo: tuple[int, str, str]) -> None:
    code, out, err = h100_demo
    assert code == 0
    assert "L2 eviction storage" in out and "5 x 100 MiB" in out
    assert f"{OUTPUTS:,} B (reads weights)" in out
    reclaimed = 5 * 100 * MiB - OWN
    assert "Reclaimed (report)" in out and f"{reclaimed:,} B" in out
    assert f"INFO flare_l2evict: reclaimed {reclaimed:,} bytes on cpu" in err


def test_json_output(h100_json: tuple[int, str]) -> None:
    code, out = h100_json
    assert code == 0
    data = parsed("startup", out)
    gained = data["with"]["kv_budget_bytes"] - data["without"]["kv_budget_bytes"]
    assert gained == data["with"]["report"]["reclaimed_bytes"] == 5 * 100 * MiB - OWN


def test_json_stock_arm_names_its_race_jobs_stock(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 35: the arm without plugins counts 2 x 100 MiB of stock buffers; its jobs read
    # "stock", never "none" (no eviction at all), whatever the device.
    code, out, _ = run(capsys, "startup", "--profile", "h100", "--race-jobs", "2", "--json")
    assert code == 0
    stock = parsed("startup", out)["without"]
    assert stock["eviction_storage_bytes"] == 2 * 100 * MiB
    assert stock["job_evictions"] == ["stock", "stock"]


def test_own_checkpoint_and_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shapes = {"a": (80 * MiB // 4,), "b": (90 * MiB // 4,)}
    path = sparse_zeros(tmp_path / "model.safetensors", shapes)
    config = tmp_path / "deploy.toml"
    config.write_text('[plugins.l2evict]\nexclude = ["b"]\n')
    code, out, _ = run(
        capsys, "startup", str(path), "--plugin", "l2evict", "--config", str(config),
        "--l2-mib", "16", "--race-jobs", "3", "--json",
    )  # fmt: skip
    assert code == 0
    report = parsed("startup", out)["with"]["report"]
    assert report["source_tensor"] == "a"
    assert report["reclaimed_bytes"] == 3 * 64 * MiB - OWN


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such checkpoint"),
        ("junk", "a text file, not a safetensors file (it starts with 'this is ')"),
        ("truncated", "(bytes 0..4,000 outside the 3,900 data bytes); fix: re-export or re-down"),
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


def test_a_missing_checkpoint_is_worded_alike_in_every_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Issue 35: startup said "no such checkpoint", plan and check "no such safetensors file"
    # or "no such index file", each with its own fix.
    for name in ("missing.safetensors", "missing.safetensors.index.json"):
        said = set()
        for command in ("startup", "plan", "check"):
            code, out, err = run(capsys, command, str(tmp_path / name))
            assert code == 2 and out == "", (command, err)
            said.add(err.removeprefix(f"error: flare-l2evict {command}: "))
        assert said == {  # the path cut as every echoed value is, past 200 characters
            f"{shown(str(tmp_path / name))}: no such checkpoint file; fix: check the path, and "
            "pass the checkpoint's .safetensors files or its model.safetensors.index.json\n"
        }


def test_bad_config_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text("[plugins.l2evict]\nwindow = -5\n")
    code, _, err = run(capsys, "startup", "--plugin", "l2evict", "--config", str(config))
    assert code == 2
    assert err.startswith(
        "error: flare-l2evict startup: plugins.l2evict.window = -5 is invalid: use 'stock'"
    )


def test_unknown_plugin_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "startup", "--plugin", "nope", "--profile", "h100")
    assert code == 2 and "--plugin nope: no such flare plugin is installed" in err
    assert "did you mean" not in err


def test_the_startup_table_says_why_the_plugin_fell_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Issue 46: the table showed 0 B and no reason; only the log on stderr said why.
    path = sparse_zeros(tmp_path / "model.safetensors", {"w": (MiB // 4,)})
    code, out, _ = run(capsys, "startup", str(path), "--plugin", "l2evict", "--race-jobs", "1")
    notes = " ".join(out.split("Reclaimed (report)")[1].split())
    assert code == 1 and "note: --plugin l2evict: fell back (stock b12x kept): " in notes, out
    assert "no storage on cpu covers the 268,435,456-byte eviction window" in notes, out
    # Installed: no such note.
    code, out, _ = run(capsys, "startup", "--plugin", "l2evict", "--l2-mib", "16")
    assert code == 0 and "fell back" not in out, out


def test_a_misspelled_plugin_gets_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 46: the docs promised a "did you mean" for a misspelled name; --plugin had none.
    code, out, err = run(capsys, "startup", "--plugin", "l2evcit")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "; fix: did you mean --plugin l2evict? (else pip install the package" in err


def test_cuda_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run(capsys, "startup", "--device", "cuda:0")
    assert code == 2 and "--device cuda:0: CUDA is not available here" in err
    assert err.endswith("; fix: --device cpu\n")


@pytest.mark.slow  # two fresh interpreters of the command line
def test_python_dash_m_and_console_script() -> None:
    # The console script pip wrote next to this interpreter: no PATH needed (a venv's bin
    # is on PATH only once activated).
    script = Path(sys.executable).with_name("flare-l2evict")
    assert script.is_file(), f"no console script next to {sys.executable}"
    for command in ([sys.executable, "-m", "flare_l2evict", "--help"], [str(script), "--help"]):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert "startup" in done.stdout


def _modules_after(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(done.stdout.split())


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_the_plugin_entry_point_imports_only_runtime_modules() -> None:
    loaded = _modules_after("import flare_l2evict.plugin")
    ours = {m for m in loaded if m.startswith("flare_l2evict")}
    assert "flare_l2evict.plugin" in ours
    assert not {m for m in ours if m.startswith("flare_l2evict.tools")}


@pytest.mark.slow  # a fresh interpreter that imports the command line
def test_help_parses_before_importing_torch() -> None:
    loaded = _modules_after(
        "from flare_l2evict.tools.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert "torch" not in loaded and "flare_l2evict.tools.reference_host" not in loaded


@pytest.mark.parametrize(
    ("argv", "cause", "fix"),
    [
        (["startup", "--bogus"], "flare-l2evict startup: unrecognized arguments: --bogus",
         "fix: see flare-l2evict startup --help"),
        (["plan"], "flare-l2evict plan: the following arguments are required: CHECKPOINT",
         "fix: see flare-l2evict plan --help"),
        ([], "the following arguments are required: command",
         "fix: name a command: startup, plan, check, example"),
        # The bench left the wheel (python -m benchmarks.bench, from a checkout).
        (["bench"], "argument command: invalid choice: 'bench'", "fix: see flare-l2evict --help"),
        (["example", "--profile", "h100"], "the following arguments are required: --out",
         "fix: see flare-l2evict example --help"),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_with_the_fix_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], cause: str, fix: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert err.startswith("error: ") and cause in err and fix in err
    assert err.count("\n") == 1 and "usage:" not in err


def test_a_huge_bad_value_still_ends_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "x", "--profile", "z" * 1_000_000])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err.encode()) <= 1024
    assert err.rstrip().endswith("fix: see flare-l2evict plan --help")


def test_help_is_argparse_usage_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["example", "--help"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        out, err = capsys.readouterr()
        assert exited.value.code == 0 and err == ""
        assert out.startswith("usage: flare-l2evict") and "options:" in out


def test_startup_says_each_fact_once_per_stream(h100_demo: tuple[int, str, str]) -> None:
    code, out, err = h100_demo
    assert code == 0
    reclaimed = f"{5 * 100 * MiB - OWN:,}"
    # The credit and the audit are the plugin's log lines; the table has the figure once.
    assert err.count(f"reclaimed {reclaimed} bytes") == 1
    assert "audit: credited" in err
    assert out.count(reclaimed) == 1 and "audit" not in out and "races read" not in out
    assert all(len(line) <= 100 for line in out.splitlines())


def test_example_writes_every_file_and_the_commands_run_on_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "example", "--out", "ex")
    assert code == 0 and "wrote 10 files to ex" in out
    names = {p.name for p in (tmp_path / "ex").iterdir()}
    assert names == {
        "model.safetensors", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "rank0.safetensors", "rank1.safetensors", "deploy.toml", "deploy.yaml", "deploy.json",
        "COMMANDS.md",
    }  # fmt: skip
    # The one file, the index and its shards are one checkpoint: the same plan.
    plans = []
    for argv in (["ex/model.safetensors"], ["ex/model.safetensors.index.json"]):
        code, out, _ = run(capsys, "plan", *argv, "--profile", "h100", "--json")
        plans.append(parsed("plan", out)["ranks"])
    assert plans[0] == plans[1] and plans[0][0]["reclaimed_bytes"] == 5 * 100 * MiB - OWN
    # The per-rank files are what plan's even TP2 split estimates.
    code, out, _ = run(capsys, "plan", "ex/model.safetensors", "--tp", "2", "--profile", "h100",
                       "--json")  # fmt: skip
    split = parsed("plan", out)
    code, out, _ = run(capsys, "plan", "ex/rank0.safetensors", "ex/rank1.safetensors", "--tp",
                       "2", "--per-rank", "--profile", "h100", "--json")  # fmt: skip
    per_rank = parsed("plan", out)
    assert per_rank["ranks"] == split["ranks"]
    # The files load as safetensors' loader reads them: zeros, the rank's half of dim 0.
    from safetensors.torch import load_file

    whole = load_file(tmp_path / "ex" / "model.safetensors")
    rank0 = load_file(tmp_path / "ex" / "rank0.safetensors")
    fused = "model.layers.3.mlp.experts.w13_weight"
    assert whole.keys() == rank0.keys()
    assert rank0[fused].shape[0] * 2 == whole[fused].shape[0] == 16
    assert not any(t.any() for t in (*whole.values(), *rank0.values()))


def test_example_refuses_a_file_as_its_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "taken").write_text("x")
    code, out, err = run(capsys, "example", "--out", str(tmp_path / "taken"))
    assert code == 2 and out == "" and "not a directory; fix:" in err and err.count("\n") == 1


def test_startup_json_cuts_a_huge_name_as_plan_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    name = "w" * 1_000_000
    path = sparse_zeros(tmp_path / "model.safetensors", {name: (64 * MiB,)})
    code, out, _ = run(capsys, "startup", str(path), "--plugin", "l2evict", "--l2-mib", "16",
                       "--json")  # fmt: skip
    assert code == 0 and len(out) < 20_000
    report = parsed("startup", out)["with"]["report"]
    assert report["source_tensor"] == "w" * 60 + "...[1,000,000 chars]"
    assert report["sources"][0]["tensor"] == report["source_tensor"]
    assert report["names_cut"] == 2 and report["reclaimed_bytes"] > 0


def test_version_names_the_package_and_its_release(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0 and err == ""
    assert out == f"flare-l2evict {version('flare-l2evict')}\n"


_SHAPE = re.compile(r"^error: flare-l2evict (startup|plan|check|example): (.+); fix: (.+)\n$")


@pytest.mark.parametrize(
    ("argv", "cause", "fix"),
    [
        (["plan", "{tmp}/missing.safetensors"], "no such checkpoint file", "check the path"),
        (["startup", "{tmp}/missing.safetensors"], "no such checkpoint file", "check the path"),
        (["check", "--config", "{tmp}/bad.toml"], "{bad}: cannot parse toml (", "correct the "
         "config file at the line named"),
        (["check", "--config", "{tmp}/window.toml"], "plugins.l2evict.window = -5 is invalid",
         "correct the deployment config's [plugins.l2evict] at the key named"),
        (["plan", "x", "--bogus"], "unrecognized arguments: --bogus",
         "see flare-l2evict plan --help"),
        (["startup", "{tmp}/index.json"], "a JSON file, not a safetensors file",
         "or its model.safetensors.index.json"),
        (["example", "--out", "{tmp}/bad.toml"], "not a directory", "name a new or existing"),
    ],
)  # fmt: skip
def test_every_error_has_one_shape(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], cause: str, fix: str
) -> None:
    (tmp_path / "bad.toml").write_text("[plugins\n")
    (tmp_path / "window.toml").write_text("[plugins.l2evict]\nwindow = -5\n")
    (tmp_path / "index.json").write_text('{"metadata": {}, "weight_map": {"w": "a.safetensors"}}')
    try:
        code = main([arg.format(tmp=tmp_path) for arg in argv])
    except SystemExit as exited:
        assert isinstance(exited.code, int)
        code = exited.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    shape = _SHAPE.match(err)
    assert shape is not None, err
    cause = cause.format(bad=shown(str(tmp_path / "bad.toml")))  # cut as every echoed value is
    assert shape.group(1) == argv[0] and cause in shape.group(2) and fix in shape.group(3)
    assert "re-download" not in err


@pytest.mark.slow  # three full start-ups of the reference host
def test_startup_takes_an_index_or_its_shards_as_one_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "example", "--out", "ex")[0] == 0
    figures = []
    for paths in (
        ["ex/model.safetensors"],
        ["ex/model.safetensors.index.json"],
        ["ex/model-00001-of-00002.safetensors", "ex/model-00002-of-00002.safetensors"],
    ):
        code, out, _ = run(capsys, "startup", *paths, "--plugin", "l2evict", "--json")
        assert code == 0
        after = parsed("startup", out)["with"]
        figures.append((after["loaded_bytes"], after["reclaimed_bytes"], after["kv_tokens"]))
    assert figures[0] == figures[1] == figures[2] and figures[0][1] > 0


@pytest.mark.slow  # a fresh interpreter per command (a blocked open fails by its timeout)
@pytest.mark.parametrize("command", ["plan", "startup", "check"])
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, command: str) -> None:
    import os

    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-m", "flare_l2evict", command, str(fifo)],
        capture_output=True,
        text=True,
        timeout=120,  # a blocked open would wait for a writer forever
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert _SHAPE.match(done.stderr) and "not a" in done.stderr, done.stderr


# --- example --out DIR writes only inside DIR (issue 28, item 5) --------------------------


def _outside(tmp_path: Path) -> tuple[Path, bytes]:
    outside = tmp_path / "outside" / "precious.txt"
    outside.parent.mkdir()
    outside.write_bytes(b"the operator's own file\n")
    return outside, outside.read_bytes()


@pytest.mark.parametrize("name", ["deploy.toml", "model.safetensors", "COMMANDS.md"])
def test_example_never_writes_through_a_hard_link(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    outside, before = _outside(tmp_path)
    out = tmp_path / "ex"
    out.mkdir()
    (out / name).hardlink_to(outside)
    code, _, err = run(capsys, "example", "--out", str(out))
    assert code == 0, err
    assert outside.read_bytes() == before and outside.stat().st_nlink == 1
    assert not (out / name).samefile(outside) and (out / name).stat().st_size > 0
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_example_never_writes_through_a_symlink_planted_after_the_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link that appears between the refusal of links and the writes is not followed."""
    from flare_l2evict.tools import _example

    outside, before = _outside(tmp_path)
    out = tmp_path / "ex"
    checked = _example._refuse_links

    def check_then_plant(directory: Path) -> None:
        checked(directory)  # the real check: it finds no link
        for name in ("deploy.json", "model-00001-of-00002.safetensors"):
            (directory / name).symlink_to(outside)  # the race an attacker wins

    monkeypatch.setattr(_example, "_refuse_links", check_then_plant)
    code, _, err = run(capsys, "example", "--out", str(out))
    assert code == 0, err
    assert outside.read_bytes() == before
    assert not (out / "deploy.json").is_symlink()
    assert json.loads((out / "deploy.json").read_text())["plugins"]["l2evict"]["enabled"]
    assert sorted(p.name for p in outside.parent.iterdir()) == ["precious.txt"]


def test_every_parser_refuses_abbreviations_and_takes_q_and_v(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flare_l2evict.tools.cli import COMMANDS
    from flare_l2evict.tools.cli._shared import parser as make_parser

    parser = make_parser(COMMANDS, "0")
    assert not parser.allow_abbrev
    for name, sub in parser.commands.items():
        assert not sub.allow_abbrev, name
        flags = {flag for action in sub._actions for flag in action.option_strings}
        assert {"-q", "--quiet", "-v", "--verbose"} <= flags, name
        text = sub.format_help()
        assert "\nexample:\n  flare-l2evict " + name in text, name
        assert "\nexit codes:\n  0    " in text and "\n  2    a usage or input error" in text, name
        assert "\n  130  interrupted (Ctrl-C or SIGTERM)" in text, name
    with pytest.raises(SystemExit) as exited:
        main(["plan", "x.safetensors", "--split-d", "1"])
    assert exited.value.code == 2 and "unrecognized arguments: --split-d" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter that imports the command line
def test_only_the_packages_logger_reaches_stderr(tmp_path: Path) -> None:
    """A library's INFO lines are not the operator's: torch's ``FakeTensor cache stats`` at exit
    followed the one error line of an interrupted command while the CLI routed the root logger."""
    script = (
        "import atexit, dataclasses, logging, sys\n"
        "from flare_l2evict.tools.cli import COMMANDS, main, plan\n"
        "torch_log = logging.getLogger('torch._subclasses.fake_tensor')\n"
        "atexit.register(torch_log.info, 'FakeTensor cache stats:')\n"
        "def plan_and_a_library_line(args):\n"
        "    logging.getLogger('some.library').info('a library line during the command')\n"
        "    return plan.COMMAND.run(args)\n"
        "mine = dataclasses.replace(plan.COMMAND, run=plan_and_a_library_line)\n"
        "commands = [mine if c.name == 'plan' else c for c in COMMANDS]\n"
        "raise SystemExit(main(sys.argv[1:], commands))\n"
    )
    index = tmp_path / "missing.safetensors"
    done = subprocess.run(
        [sys.executable, "-c", script, "plan", str(index)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: flare-l2evict plan: ") and "no such" in line


def test_the_cli_routes_its_logger_and_gives_it_back(capsys: pytest.CaptureFixture[str]) -> None:
    """In-process, ``main`` leaves the logger as it found it: a host's own handlers see lines."""
    logger = logging.getLogger("flare_l2evict")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    code, _, err = run(capsys, "startup", "--plugin", "l2evict", "--profile", "h100")
    assert code == 0 and "INFO flare_l2evict: reclaimed" in err
    assert (logger.handlers, logger.level, logger.propagate) == (handlers, level, propagate)


@pytest.mark.slow  # two fresh interpreters, each a start-up
def test_quiet_logs_only_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    """-q: the plugin's INFO credit line is not logged; stdout is the same table."""
    script = (
        "import logging, sys\n"
        "from flare_l2evict.tools.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "raise SystemExit(code)\n"
    )
    # The two fresh processes run at once: each spends most of its time importing.
    started = [
        subprocess.Popen([sys.executable, "-c", script, *H100_DEMO, *quiet], stdout=PIPE,
                         stderr=PIPE, text=True)
        for quiet in ([], ["-q"])
    ]  # fmt: skip
    (loud_out, loud_err), (quiet_out, quiet_err) = (p.communicate(timeout=300) for p in started)
    assert [p.returncode for p in started] == [0, 0], (loud_err, quiet_err)
    loud = subprocess.CompletedProcess(started[0].args, 0, loud_out, loud_err)
    quiet = subprocess.CompletedProcess(started[1].args, 0, quiet_out, quiet_err)
    assert "INFO flare_l2evict: reclaimed" in loud.stderr
    assert "INFO" not in quiet.stderr and quiet.stdout == loud.stdout


def test_every_json_object_carries_its_schema(
    capsys: pytest.CaptureFixture[str], h100_json: tuple[int, str]
) -> None:
    assert parsed("startup", h100_json[1])["schema"] == 3
    main(["check", "--device", "cpu", "--json"])
    assert parsed("check", capsys.readouterr().out)["schema"] == 3


@pytest.mark.slow  # a fresh interpreter that imports torch
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


def test_on_error_raise_names_what_to_change(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Issue 35: "fix: see flare-l2evict startup --help" fixed nothing. A cause without a fix
    # of its own gets on_error = "fallback"; one with its own fix keeps it.
    config = tmp_path / "deploy.toml"
    config.write_text('[plugins.l2evict]\non_error = "raise"\nexclude = ["*"]\n')
    code, out, err = run(capsys, "startup", "--plugin", "l2evict", "--config", str(config))
    line = the_error(err)
    assert code == 2 and out == ""
    assert line.startswith("error: flare-l2evict startup: l2evict failed and on_error = 'raise': ")
    assert line.endswith(
        '; fix: set on_error = "fallback" in the config\'s [plugins.l2evict] section (start-up '
        "then keeps stock b12x and credits 0 instead of aborting)\n"
    ), err
    own = L2EvictError("l2evict failed and on_error = 'raise': busy; fix: call it once")
    line = error_line("flare-l2evict startup", str(own), fix_for(own))
    assert line.endswith("; fix: call it once")
