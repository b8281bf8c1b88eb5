"""Usage and input errors are answered before torch or b12x is imported (issue 29, item 1).

Each mistake runs in a fresh interpreter that calls the CLI's ``main`` and then
reports whether ``torch`` and ``b12x`` are in ``sys.modules``: the clock varies
with the machine, the modules do not. The wall time of each refusal is printed
(``-s``) for the record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, sys
from flare_l2evict.tools._cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exited:
    code = exited.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules,
                  "b12x": any(m == "b12x" or m.startswith("b12x.") for m in sys.modules)}))
"""

CASES: list[tuple[str, list[str], str]] = [
    ("misspelled --plugin", ["startup", "--plugin", "l2evic"], "no such flare plugin"),
    ("missing --config", ["startup", "--config", "{dir}/missing.toml"], "no such config file"),
    ("window = 256MBB", ["startup", "--plugin", "l2evict", "--config", "{dir}/bad.toml"],
     "window"),
    ("unknown config key", ["startup", "--plugin", "l2evict", "--config", "{dir}/unknown.toml"],
     "unknown key"),
    ("missing checkpoint (startup)", ["startup", "{dir}/missing.safetensors"],
     "no such checkpoint"),
    ("a text file as checkpoint (startup)", ["startup", "{dir}/notes.txt"], "a text file"),
    ("window = 256MBB (check)", ["check", "--config", "{dir}/bad.toml"], "window"),
    ("missing checkpoint (check)", ["check", "{dir}/missing.safetensors"], "no such"),
    ("abbreviated flag", ["startup", "--race-job", "3"], "unrecognized arguments"),
    ("schema of no JSON command", ["schema", "example"], "invalid choice: 'example'"),
    ("unknown config key (plan)", ["plan", "{dir}/missing.safetensors", "--config",
                                   "{dir}/unknown.toml"], "unknown key"),
]  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("mistakes")
    (where / "bad.toml").write_text('[plugins.l2evict]\nwindow = "256MBB"\n')
    (where / "unknown.toml").write_text('[plugins.l2evict]\nwindw = "stock"\n')
    (where / "notes.txt").write_text("the weights are in the other directory\n")
    return where


@pytest.mark.parametrize(("what", "argv", "said"), CASES, ids=[c[0] for c in CASES])
def test_each_mistake_is_refused_before_torch_is_imported(
    inputs: Path, what: str, argv: list[str], said: str
) -> None:
    args = [a.format(dir=inputs) for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    wall = time.perf_counter() - began
    print(f"\nrefused in {wall:.2f} s: {what}: {done.stderr.strip()[:160]}")
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] == 2, (what, done.stderr)
    assert not seen["torch"], f"{what}: torch was imported before the refusal"
    assert not seen["b12x"], f"{what}: b12x was imported before the refusal"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: flare-l2evict "), done.stderr
    assert said in lines[0] and "; fix: " in lines[0]
