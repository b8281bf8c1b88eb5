"""``--json`` with a real schema (issue 35, item 4).

``flare-l2evict schema startup|plan|check`` prints each command's JSON Schema;
every ``--json`` object the CLI tests read is validated against it
(:func:`support.json_output.parsed`); the field tables in
``docs/command-line.md`` are the models'.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from support.json_output import parsed, schema_of, validate
from support.scripts import script

from flare_l2evict.tools import main
from flare_l2evict.tools._json_output import SCHEMA_VERSION

docs = script("command_line_docs")
COMMANDS = ("startup", "plan", "check")


@pytest.mark.parametrize("command", COMMANDS)
def test_schema_prints_the_json_schema_of_each_command(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert main(["schema", command]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    printed = json.loads(out)
    assert printed == schema_of(command)
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert printed["properties"]["schema"]["const"] == SCHEMA_VERSION == 3
    assert printed["additionalProperties"] is False
    assert printed["required"] == list(printed["properties"])


def test_schema_of_another_name_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["schema", "example"], ["schema"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        out, err = capsys.readouterr()
        assert exited.value.code == 2 and out == "", argv
        (line,) = err.splitlines()
        assert line.startswith("error: flare-l2evict schema: ") and "; fix: " in line, line


@pytest.mark.slow  # a fresh interpreter of the command line
def test_schema_answers_without_importing_torch() -> None:
    probe = (
        "import sys\nfrom flare_l2evict.tools.cli import main\ncode = main(['schema', 'check'])\n"
        "print('torch' in sys.modules, file=sys.stderr)\nraise SystemExit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stderr == "False\n", done.stderr[-2000:]


@pytest.fixture
def plan_output(
    capsys: pytest.CaptureFixture[str], write_checkpoint: Callable[..., Path]
) -> dict[str, Any]:
    import torch

    path = write_checkpoint({"w": torch.zeros(1 << 18)})
    assert main(["plan", str(path), "--json"]) == 1  # 1 MiB covers no window: it falls back
    return parsed("plan", capsys.readouterr().out)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d.pop("seconds"), "required key 'seconds' is missing"),
        (lambda d: d.update(extra=1), "key 'extra' is not in the schema"),
        (lambda d: d.update(schema=1), "$.schema: 1 is not 3"),
        (lambda d: d["ranks"][0].update(reclaimed_bytes=-1), "$.ranks[0].reclaimed_bytes: -1 < 0"),
        (lambda d: d["ranks"][0].update(tensor=5), "$.ranks[0].tensor: matches none of anyOf"),
        (lambda d: d.update(exit_code=True), "$.exit_code: True is not integer"),
    ],
)
def test_the_validator_refuses_what_the_schema_refuses(
    plan_output: dict[str, Any], change: Any, said: str
) -> None:
    broken = copy.deepcopy(plan_output)
    change(broken)
    with pytest.raises(AssertionError) as refused:
        validate(broken, schema_of("plan"))
    assert said in str(refused.value)


def test_check_races_figures_fit_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """``--races`` runs only on a GPU: its figures, from the real judgement, in check's JSON."""
    from flare_l2evict.tools._races_check import RaceAgreement, _judge

    assert main(["check", "--device", "cpu", "--json"]) == 0
    figures = parsed("check", capsys.readouterr().out)
    assert figures["races"] is None
    result = RaceAgreement(races=1, repeats=2)
    latencies = {"stock": (10.0, 14.0), "plugin": (9.0, 7.0), "stock_rerun": (10.1, 14.1)}
    _judge(result, {arm: [[lat], [lat]] for arm, lat in latencies.items()})
    figures["races"] = result.model_dump(mode="json")
    validate(figures, schema_of("check"))


def test_a_key_without_a_description_stops_the_tables() -> None:
    with pytest.raises(ValueError, match=r"^the top\.x has no description: give its Field one"):
        docs._tables({"properties": {"x": {"type": "integer"}}})


def test_the_plugin_models_fields_get_their_descriptions_in_the_startup_schema() -> None:
    from flare_l2evict.tools import _json_output

    defs = schema_of("startup")["$defs"]
    for model, texts in _json_output._DESCRIPTIONS.items():
        # startup prints the plugin's report as a subclass of it: the words land there too.
        where = "StartupReport" if model.__name__ == "ReclaimReport" else model.__name__
        for name, text in texts.items():
            assert defs[where]["properties"][name]["description"] == text, (where, name)


@pytest.mark.parametrize("renamed", ["source_tensor", "rank"])
def test_a_described_field_renamed_in_its_model_fails_every_schema(
    monkeypatch: pytest.MonkeyPatch, renamed: str
) -> None:
    # Issue 46: the words were keyed by class-name strings, so a rename dropped them silently.
    from flare_l2evict._report import ReclaimReport
    from flare_l2evict.tools import _json_output

    texts = dict(_json_output._DESCRIPTIONS[ReclaimReport])
    texts["source_name"] = texts.pop(renamed)  # as if the model's field had been renamed
    table: dict[type[BaseModel], dict[str, str]] = {
        **_json_output._DESCRIPTIONS,
        ReclaimReport: texts,
    }
    monkeypatch.setattr(_json_output, "_DESCRIPTIONS", table)
    with pytest.raises(LookupError, match=r"^_DESCRIPTIONS names ReclaimReport\.source_name: "):
        schema_of("startup")


def test_a_field_the_model_describes_itself_is_not_described_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flare_l2evict._report import DeviceAudit
    from flare_l2evict.tools import _json_output

    texts = {**_json_output._DESCRIPTIONS[DeviceAudit], "requested": "Evictions asked for."}
    table: dict[type[BaseModel], dict[str, str]] = {
        **_json_output._DESCRIPTIONS,
        DeviceAudit: texts,
    }
    monkeypatch.setattr(_json_output, "_DESCRIPTIONS", table)
    with pytest.raises(LookupError, match=r"^DeviceAudit\.requested is described twice$"):
        schema_of("startup")
