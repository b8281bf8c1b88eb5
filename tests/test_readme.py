"""The README runs: every Python snippet, every CPU command, every config, and the output it shows.

Fenced blocks are read by their info string:

- ``python``: run in a fresh interpreter;
- ``toml``: parsed and validated as the deployment config it documents;
- ``bash``: each line a command, run through the CLI (``# exit N`` after a
  command says the exit code it must give; a ``pip install ... &&`` prefix is
  CI's install step, ``.ci/run`` itself);
- ``bash gpu``: the same, on a CUDA machine only (the GPU suite runs them);
- ``bash host``: flare's own commands, not run here;
- ``text output`` / ``text log``: lines the README's setup command must print
  on stdout / in its log.

Commands run in a directory holding the files they name: the embedded example
as ``model.safetensors``, the README's own config as ``deploy.toml``, a sparse
sharded checkpoint with its index, and two per-rank files.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from flare_l2evict._settings import settings_from_config
from flare_l2evict._units import MiB
from flare_l2evict.tools._cli import main
from flare_l2evict.tools.reference_host import write_example_checkpoint, write_sparse_index

README = Path(__file__).resolve().parents[1] / "README.md"
CI = Path(__file__).resolve().parents[1] / ".ci" / "run"
_FENCE = re.compile(r"^```([a-z]+)(?: ([a-z]+))?\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    language: str
    tag: str
    text: str
    line: int


def blocks(language: str, tag: str = "") -> list[Block]:
    text = README.read_text(encoding="utf-8")
    found = [
        Block(m.group(1), m.group(2) or "", m.group(3), text.count("\n", 0, m.start()) + 1)
        for m in _FENCE.finditer(text)
    ]
    return [b for b in found if b.language == language and b.tag == tag]


@dataclass(frozen=True)
class Command:
    argv: list[str]
    exit_code: int
    where: str


def commands(block: Block) -> Iterator[Command]:
    for offset, raw in enumerate(block.text.splitlines()):
        line, _, comment = raw.partition("  #")
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "&&" in line:  # "pip install ... && COMMAND": the install is CI's own step
            install, _, line = (part.strip() for part in line.partition("&&"))
            assert install.startswith("pip install "), raw
        expected = re.search(r"exit (\d+)", comment)
        yield Command(
            shlex.split(line),
            int(expected.group(1)) if expected else 0,
            f"README:{block.line + offset + 1}",
        )


def cpu_commands() -> list[Command]:
    return [command for block in blocks("bash") for command in commands(block)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the README's commands name."""
    from safetensors.torch import save_file

    where = tmp_path_factory.mktemp("readme")
    write_example_checkpoint(where, 256 * MiB)
    (toml,) = blocks("toml")
    (where / "deploy.toml").write_text(toml.text)
    write_sparse_index(where, files=4, layers=4, experts=8)
    for rank in range(2):
        save_file({f"w.rank{rank}": torch.zeros(17 * MiB)}, str(where / f"rank{rank}.safetensors"))
    return where


def run(command: Command, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.chdir(workdir)
    if command.argv[:3] == ["python", "-m", "pytest"]:
        return 0  # this very run; that CI runs it is checked below
    assert command.argv[0] == "flare-l2evict", f"{command.where}: not a CLI command"
    return main(command.argv[1:])


@pytest.mark.parametrize("command", cpu_commands(), ids=lambda c: " ".join(c.argv)[:60])
def test_every_cpu_command_in_the_readme_runs(
    command: Command, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(command, workdir, monkeypatch) == command.exit_code, command.where


@pytest.mark.gpu
@pytest.mark.parametrize(
    "command",
    [c for b in blocks("bash", "gpu") for c in commands(b)],
    ids=lambda c: " ".join(c.argv)[:60],
)
def test_every_gpu_command_in_the_readme_runs(
    command: Command, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(command, workdir, monkeypatch) == command.exit_code, command.where


def test_the_two_setup_commands_are_what_ci_runs() -> None:
    setup = [b.text.strip() for b in blocks("bash") if b.text.strip().startswith("pip install")]
    assert setup == [
        "pip install torch==2.13.0 -e . && flare-l2evict startup --plugin l2evict",
        "pip install torch==2.13.0 -e '.[test]' && python -m pytest",
    ]
    ci = CI.read_text()
    assert "pip install --quiet torch==2.13.0" in ci
    assert "pip install --quiet -e '.[test]'" in ci
    assert "\npython -m pytest\n" in ci


def test_the_shown_output_and_log_lines_are_what_the_setup_command_prints() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flare_l2evict", "startup", "--plugin", "l2evict"],
        capture_output=True,
        text=True,
        check=True,
    )
    for block in blocks("text", "output"):
        for line in block.text.splitlines():
            assert line in done.stdout.splitlines(), f"README:{block.line}: {line!r}"
    for block in blocks("text", "log"):
        for line in block.text.splitlines():
            assert line in done.stderr.splitlines(), f"README:{block.line}: {line!r}"


def test_every_python_snippet_runs(tmp_path: Path) -> None:
    snippets = blocks("python")
    assert snippets
    for block in snippets:
        done = subprocess.run(
            [sys.executable, "-c", block.text], capture_output=True, text=True, cwd=tmp_path
        )
        assert done.returncode == 0, f"README:{block.line}: {done.stderr[-2000:]}"


def test_every_config_is_valid() -> None:
    import tomllib

    configs = blocks("toml")
    assert configs
    for block in configs:
        settings = settings_from_config(tomllib.loads(block.text))
        assert settings.enabled and settings.exclude, f"README:{block.line}"


def test_host_commands_name_the_plugin() -> None:
    (host,) = blocks("bash", "host")
    assert "--plugin l2evict" in host.text and "pip install flare-l2evict" in host.text


def test_every_block_is_of_a_known_kind() -> None:
    known = {("python", ""), ("toml", ""), ("bash", ""), ("bash", "gpu"), ("bash", "host")}
    known |= {("text", "output"), ("text", "log")}
    text = README.read_text(encoding="utf-8")
    seen = {(m.group(1), m.group(2) or "") for m in _FENCE.finditer(text)}
    assert seen <= known, seen - known
    assert text.count("```") == 2 * len(list(_FENCE.finditer(text)))  # no block unread
