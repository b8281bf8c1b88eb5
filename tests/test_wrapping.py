"""Lines an operator copies stay whole: one wrapping rule, for every command (issue 46).

Case -> outcome:

- a word longer than the width -> a line of its own, never cut in two;
- a value named whole, blanks inside -> never broken at them;
- ``check``, ``plan`` and ``startup`` with ``--config`` at a 240-character path, in a
  60-column terminal -> the path whole on one line of stdout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.checkpoints import sparse_zeros

from flare_l2evict.tools._wrapping import WIDTH, wrap
from flare_l2evict.tools.cli import main


def test_a_word_longer_than_the_width_is_a_line_of_its_own() -> None:
    path = "/" + "d" * 150 + "/deploy.toml"
    lines = wrap(f"config: [plugins.l2evict] found in {path}, 2 keys", 60, rest="    ")
    assert lines == ["config: [plugins.l2evict] found in", f"    {path},", "    2 keys"]


def test_lines_break_at_blanks_only() -> None:
    text = " ".join(["a-b-c-d", "12,345,678", "model.layers.0.mlp"] * 20)
    lines = wrap(text, 30)
    assert all(len(line) <= 30 for line in lines)
    assert " ".join(lines) == text  # nothing cut: each break was a blank


def test_a_value_named_whole_is_never_broken_at_its_blanks() -> None:
    path = "/models/my " + "x" * 40 + " dir/deploy.toml"
    text = f"config: no [plugins.l2evict] in {path}: defaults apply"
    assert all(path not in line for line in wrap(text, 40))  # the control: broken
    lines = wrap(text, 40, whole=[path])
    assert any(f"{path}:" == line for line in lines), lines
    assert " ".join(lines) == text


@pytest.mark.parametrize("command", ["check", "plan", "startup"])
def test_a_long_config_path_is_whole_on_one_line_in_a_narrow_terminal(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: check (and plan, past 100 columns) cut the path inside a name.
    monkeypatch.setenv("COLUMNS", "60")
    # Past 200 characters too: the line once cut a value there (_text.LIMIT).
    # The folder's own name is long and distinctive whatever TMPDIR is: a piece of it on a
    # line other than the path's is a cut path.
    folder = tmp_path / ("cut-" + "d" * max(40, 240 - len(str(tmp_path)) - len("/deploy.toml") - 5))
    folder.mkdir()
    config = folder / "deploy.toml"
    config.write_text("[plugins.l2evict]\nwindow = 'stock'\n")
    assert len(str(config)) >= 240 > WIDTH
    checkpoint = sparse_zeros(tmp_path / "model.safetensors", {"w": (1 << 20,)})
    argv = {
        "check": ["check", "--device", "cpu"],
        "plan": ["plan", str(checkpoint)],
        "startup": ["startup", str(checkpoint), "--plugin", "l2evict", "--l2-mib", "1"],
    }[command]
    assert main([*argv, "--race-jobs", "1", "--config", str(config)]) in (0, 1)
    lines = capsys.readouterr().out.splitlines()
    held = [line for line in lines if str(config) in line]
    assert len(held) == 1, lines
    assert not any(folder.name[:20] in line for line in lines if line not in held), lines
