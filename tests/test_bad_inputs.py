"""Every bad input tried, with the one line it must give (CLI: exit 2; hook: a 0 report)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from figures import MiB

from flare_l2evict.tools._cli import main
from flare_l2evict.tools.reference_host import plugin_manager


def header_file(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def bad_files(tmp: Path) -> dict[str, Path]:
    f32 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    return {
        "gap": header_file(
            tmp / "gap.safetensors",
            {"a": f32, "b": {"dtype": "F32", "shape": [4], "data_offsets": [32, 48]}},
            bytes(48),
        ),
        "shape": header_file(
            tmp / "shape.safetensors",
            {"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}},
            bytes(16),
        ),
        "dtype": header_file(
            tmp / "dtype.safetensors",
            {"a": {"dtype": "F99", "shape": [4], "data_offsets": [0, 16]}},
            bytes(16),
        ),
        "tail": header_file(tmp / "tail.safetensors", {"a": f32}, bytes(20)),
        "meta": header_file(
            tmp / "meta.safetensors", {"__metadata__": {"k": 1}, "a": f32}, bytes(16)
        ),
        "index": tmp / "bad.index.json",
    }


CLI_CASES: list[tuple[list[str], str]] = [
    (["plan", "{gap}"], "gap or overlap"),
    (["plan", "{shape}"], "F32 [5] needs 20 bytes, the offsets span 16"),
    (["plan", "{dtype}"], "unknown dtype 'F99'"),
    (["plan", "{tail}"], "tensors cover 16 of the 20 data bytes"),
    (["plan", "{meta}"], "__metadata__ must map strings to strings"),
    (["plan", "{index}"], "not a safetensors index"),
    (["plan", "{tmp}/missing.safetensors"], "no such safetensors file"),
    (["startup", "{tmp}/missing.safetensors"], "no such checkpoint"),
    (["startup", "--config", "{tmp}"], "is a directory, not a config file"),
    (["startup", "--config", "{tmp}/nope.toml"], "no such config file"),
    (["check", "--config", "{cfg_window}"], "plugins.l2evict.window = 1 is invalid"),
    (["check", "--config", "{cfg_plugins}"], "[plugins] must be a table of keys, not list"),
]
ARGPARSE_CASES: list[tuple[list[str], str]] = [
    (["startup", "--race-jobs", "100000000"], "must be between 1 and 1,024"),
    (["startup", "--l2-mib", "99999999"], "must be between 1 and 4,096"),
    (["startup", "--memory-gib", "0"], "must be between 1 and 4,096"),
    (["plan", "x", "--tp", "-1"], "must be between 1 and 1,024"),
    (["startup", "--device", "cpu:5"], "'cpu:5' is not a device"),
    (["startup", "--device", "tpu"], "'tpu' is not a device"),
]


@pytest.mark.parametrize(("argv", "line"), CLI_CASES, ids=[c[1][:40] for c in CLI_CASES])
def test_cli_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    files = bad_files(tmp_path)
    files["index"].write_text("{not json")
    (tmp_path / "w.toml").write_text("[plugins.l2evict]\nwindow = 1\n")
    (tmp_path / "p.json").write_text('{"plugins": ["l2evict"]}')
    names = {k: str(v) for k, v in files.items()}
    names |= {"tmp": str(tmp_path), "cfg_window": str(tmp_path / "w.toml")}
    names["cfg_plugins"] = str(tmp_path / "p.json")
    code = main([a.format(**names) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and line in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(("argv", "line"), ARGPARSE_CASES, ids=[c[1] for c in ARGPARSE_CASES])
def test_absurd_flags_are_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and line in capsys.readouterr().err


def test_plan_and_safetensors_agree_on_a_gap(tmp_path: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    with pytest.raises(SafetensorError):
        load_file(str(bad_files(tmp_path)["gap"]))


RUNTIME_CASES: list[tuple[str, object, str]] = [
    ("race_jobs", -1, "runtime.race_jobs = -1: the host must pass a whole number in 0..1024"),
    ("race_jobs", 10**9, "runtime.race_jobs = 1000000000"),
    ("rank", 3, "runtime.rank = 3: the host must pass a whole number in 0..0"),
    ("rank", -1, "runtime.rank = -1"),
    ("world_size", 0, "runtime.world_size = 0: the host must pass a whole number >= 1"),
    ("device", "tpu", "runtime.device = 'tpu'"),
    ("device", 7, "runtime.device = 7"),
    ("l2_cache_bytes", -5, "runtime.l2_cache_bytes = -5"),
    ("l2_cache_bytes", None, "runtime.l2_cache_bytes = None: the host must pass the L2 size"),
    ("config", [1], "runtime.config = [1]: the host must pass the deployment config"),
    ("kv_allocator", object(), "runtime.kv_allocator = <object"),
]


@pytest.mark.parametrize(
    ("name", "value", "line"), RUNTIME_CASES, ids=[c[2][:40] for c in RUNTIME_CASES]
)
def test_runtime_values_out_of_range_are_one_line(
    make_runtime: Callable, name: str, value: object, line: str
) -> None:
    runtime = make_runtime({"w": torch.zeros(64 * MiB // 4)})
    setattr(runtime, name, value)
    report = plugin_manager(["l2evict"]).hook.before_first_capture(runtime=runtime)[0]
    assert report.reclaimed_bytes == 0 and line in report.reason
    assert "\n" not in report.reason


def test_a_tensor_name_that_is_not_a_string_is_one_line(make_runtime: Callable) -> None:
    runtime = make_runtime({7: torch.zeros(64 * MiB // 4)})
    report = plugin_manager(["l2evict"]).hook.before_first_capture(runtime=runtime)[0]
    assert report.reclaimed_bytes == 0
    assert report.reason.startswith("resident tensor name 7 has type int, not str; fix:")
    assert "\n" not in report.reason and "validation" not in report.reason.lower()
