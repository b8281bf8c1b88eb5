"""One meaning per exit code, for startup, plan and check (issue 29, item 2).

0: the plugin installs and credits, or it is disabled by config (the
operator's choice); 1: it falls back, on this device or on any rank; 2: a
usage or input error. Each command, each case, through the real CLI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.figures import MiB
from support.json_output import parsed

from flare_l2evict.tools import main


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The module's inputs, written once (every command only reads them)."""
    from safetensors.torch import save_file

    where = tmp_path_factory.mktemp("exit-codes")
    disabled = where / "disabled.toml"
    disabled.write_text("[plugins.l2evict]\nenabled = false\n")
    # Covers the h100 profile's 100 MiB window, and falls short of it.
    save_file({"w": torch.zeros(128 * MiB // 4)}, str(where / "big.safetensors"))
    save_file({"w": torch.zeros(MiB // 4)}, str(where / "small.safetensors"))
    return {
        "big": where / "big.safetensors",
        "small": where / "small.safetensors",
        "disabled": disabled,
    }


def _code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exited:  # argparse's usage errors
        assert isinstance(exited.code, int)
        return exited.code


TABLE = [
    ("startup", "installs", ["startup", "{big}", "--plugin", "l2evict"], 0),
    ("startup", "falls back", ["startup", "{small}", "--plugin", "l2evict"], 1),
    ("startup", "disabled", ["startup", "{big}", "--plugin", "l2evict", "--config", "{disabled}"],
     0),
    ("startup", "usage error", ["startup", "--plugin", "l2evict", "--race-job", "3"], 2),
    ("plan", "installs", ["plan", "{big}"], 0),
    ("plan", "falls back", ["plan", "{small}"], 1),
    ("plan", "any rank falls back", ["plan", "{big}", "{small}", "--tp", "2", "--per-rank"], 1),
    ("plan", "every rank falls back", ["plan", "{small}", "{small}", "--tp", "2", "--per-rank"],
     1),
    ("plan", "disabled", ["plan", "{big}", "--config", "{disabled}"], 0),
    ("plan", "usage error", ["plan", "{big}", "--tp", "0"], 2),
    ("check", "installs", ["check", "--device", "cpu", "{big}"], 0),
    ("check", "falls back", ["check", "--device", "cpu", "{small}"], 1),
    ("check", "disabled", ["check", "--device", "cpu", "{big}", "--config", "{disabled}"], 0),
    ("check", "usage error", ["check", "--device", "cpu", "--jsn"], 2),
    ("check", "input error", ["check", "--device", "cpu", "{disabled}"], 2),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "case", "argv", "code"), TABLE, ids=[f"{c}-{w}" for c, w, _, _ in TABLE]
)
def test_the_exit_code_table(
    cases: dict[str, Path], command: str, case: str, argv: list[str], code: int
) -> None:
    args = [a.format(**cases) for a in argv] + ["--profile", "h100"]
    assert _code(args) == code, (command, case)


@pytest.mark.parametrize("command", ["startup", "plan", "check"])
def test_json_says_the_exit_code_it_gives(
    cases: dict[str, Path], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    extra = ["--device", "cpu"] if command == "check" else []
    extra += ["--plugin", "l2evict"] if command == "startup" else []
    for path, code in ((cases["big"], 0), (cases["small"], 1)):
        assert main([command, str(path), *extra, "--profile", "h100", "--json"]) == code
        figures = parsed(command, capsys.readouterr().out)
        assert figures["exit_code"] == code and figures["schema"] == 3


def test_disabled_is_an_info_line_in_check_not_a_fall_back(
    cases: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--device", "cpu", "--config", str(cases["disabled"])]) == 0
    out = capsys.readouterr().out
    assert "verdict: disabled by config, credit 0 bytes (stock b12x)" in out
    assert "falls back" not in out.split("verdict:")[-1]


@pytest.mark.parametrize("command", ["startup", "plan", "check"])
def test_disabled_reads_disabled_by_config_in_every_command(
    cases: dict[str, Path], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # Issue 35: enabled = false is the operator's choice; no command calls it a fallback.
    extra = {"startup": ["--plugin", "l2evict"], "check": ["--device", "cpu"]}.get(command, [])
    argv = [command, str(cases["big"]), *extra, "--config", str(cases["disabled"])]
    assert main([*argv, "--profile", "h100"]) == 0
    out = capsys.readouterr().out
    assert "disabled by config" in out and "falls back" not in out, out
