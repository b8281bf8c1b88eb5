"""Every bad input to the command line tried (files, flags, configs), with the one line it must
give and exit 2.

A host's bad runtime values (the hook's inputs: a 0 report and one line) are in
``test_host_values.py``.
"""

from __future__ import annotations

import json
import re
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from flare_l2evict import L2EvictError
from flare_l2evict._text import shown
from flare_l2evict.tools import main


def header_file(path: Path, header: dict[str, Any], data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def header_raw(path: Path, raw: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def header_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def sparse_header(path: Path, length: int) -> Path:
    """A file that declares a ``length``-byte header; only its first bytes take disk."""
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", length) + b'{"a":{"dtype":"F32","shape":[1],')
        handle.truncate(8 + length + 4)
    return path


def write_real(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    return path


def index_file(path: Path, weight_map: dict[str, object]) -> Path:
    path.write_text(json.dumps({"weight_map": weight_map}))
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
        # Issue 46: a large size was printed as 3.35544e+07 beside grouped offsets.
        "large_shape": header_file(
            tmp / "large_shape.safetensors",
            {"a": {"dtype": "F32", "shape": [1 << 23], "data_offsets": [0, 16]}},
            bytes(16),
        ),
        "part_byte": header_file(
            tmp / "part_byte.safetensors",
            {"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}},
            bytes(2),
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
        "deep": header_raw(
            tmp / "deep.safetensors", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        ),
        "utf16": header_raw(tmp / "utf16.safetensors", json.dumps({"a": f32}).encode("utf-16")),
        "dup_field": header_raw(
            tmp / "dup.safetensors",
            b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"dtype":"F32"}}',
            bytes(16),
        ),
        "surrogate": header_raw(
            tmp / "surrogate.safetensors",
            b'{"\\ud800":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}',
            bytes(16),
        ),
        "overflow": header_file(
            tmp / "overflow.safetensors",
            {"a": {"dtype": "F32", "shape": [2**40, 2**40, 0], "data_offsets": [0, 0]}},
            b"",
        ),
        "nan": header_raw(
            tmp / "nan.safetensors",
            b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":NaN}}',
            bytes(16),
        ),
        "huge_header": sparse_header(tmp / "huge.safetensors", 102_000_000),
        "two_w": write_real(tmp / "two_w.safetensors", {"w": torch.zeros(4)}),
        "one_w": write_real(tmp / "one_w.safetensors", {"w": torch.zeros(8)}),
        "index_int": index_file(tmp / "int.index.json", {"w": 5}),
        "index_list": index_file(tmp / "list.index.json", {"w": ["one_w.safetensors"]}),
        "index_null": index_file(tmp / "null.index.json", {"w": None}),
        "index_absent": index_file(tmp / "absent.index.json", {"zz": "one_w.safetensors"}),
        "index_deep": header_text(tmp / "deep.index.json", "[" * 100_000 + "]" * 100_000),
        "scalar": write_real(tmp / "scalar.safetensors", {"s": torch.tensor(1.0)}),
    }


CLI_CASES: list[tuple[list[str], str]] = [
    (["plan", "{gap}"], "gap or overlap"),
    (["plan", "{shape}"], "F32 [5] needs 20 bytes, the offsets span 16"),
    (["plan", "{large_shape}"], "F32 [8388608] needs 33,554,432 bytes, the offsets span 16)"),
    (["plan", "{part_byte}"], "F4 [3] needs 12 bits, not whole bytes, the offsets span 2)"),
    (["plan", "{dtype}"], "unknown dtype 'F99'"),
    (["plan", "{tail}"], "tensors cover 16 of the 20 data bytes"),
    (["plan", "{meta}"], "__metadata__ must map strings to strings"),
    (["plan", "{index}"], "not a safetensors index"),
    (["plan", "{tmp}/missing.safetensors"], "no such checkpoint file"),
    (["startup", "{tmp}/missing.safetensors"], "no such checkpoint"),
    (["startup", "--config", "{tmp}"], "is a directory, not a config file"),
    (["startup", "--config", "{tmp}/nope.toml"], "no such config file"),
    (["check", "--config", "{cfg_window}"], "plugins.l2evict.window = 1 is invalid"),
    (["check", "--config", "{cfg_plugins}"], "[plugins] must be a table of keys, not list"),
    # Headers held to what safetensors' loader accepts (plan and check read them alike).
    (["plan", "{deep}"], "(the header nests deeper than 127 levels, serde_json's limit)"),
    (["check", "{deep}"], "(the header nests deeper than 127 levels, serde_json's limit)"),
    (["plan", "{utf16}"], "(the header is not UTF-8 (byte 0))"),
    (["plan", "{dup_field}"], "corrupt safetensors header at 'a' (duplicate field 'dtype')"),
    (["plan", "{surrogate}"], "(the header has a lone surrogate escape)"),
    (["plan", "{overflow}"], "at 'a' (shape [1099511627776, 1099511627776, 0] overflows 64 bits)"),
    (["plan", "{nan}"], "corrupt safetensors header (NaN is not JSON)"),
    (
        ["plan", "{huge_header}"],
        "declares 102,000,000 header bytes over safetensors' limit of 100,000,000",
    ),
    (
        ["check", "{huge_header}"],
        "declares 102,000,000 header bytes over safetensors' limit of 100,000,000",
    ),
    (["plan", "{tmp}"], "is a directory, not a safetensors file"),
    # Files are identities; a name in two of them is ambiguous.
    (["plan", "{one_w}", "{two_w}"], "tensor 'w' is in two files: "),
    (["check", "{one_w}", "{two_w}"], "tensor 'w' is in two files: "),
    (["plan", "{index_int}"], "weight_map['w'] is a JSON number, not a shard file name"),
    (["plan", "{index_list}"], "weight_map['w'] is a JSON array, not a shard file name"),
    (["plan", "{index_null}"], "weight_map['w'] is a JSON null, not a shard file name"),
    (["plan", "{index_absent}"], "names tensor 'zz' in shard 'one_w.safetensors', which does not"),
    (["plan", "{index_deep}"], "not a safetensors index (the file nests too deeply)"),
    # Deployment configs: no YAML anchors or aliases, bounded echoes.
    (
        ["check", "--config", "{cfg_self_alias}"],
        "yaml anchors/aliases are not allowed (line 3); fix: write the values out",
    ),
    (
        ["plan", "{one_w}", "--config", "{cfg_bomb}"],
        "yaml anchors/aliases are not allowed (line 1); fix: write the values out",
    ),
    (["check", "--config", "{cfg_int_key}"], "plugins.l2evict.1: unknown key (allowed keys:"),
    (["check", "--config", "{cfg_many_keys}"], "holds more than 64 keys (read no further)"),
    (["check", "--config", "{cfg_sixty_keys}"], "unknown key (allowed keys: enabled, window"),
]
ARGPARSE_CASES: list[tuple[list[str], str]] = [
    (["startup", "--race-jobs", "100000000"], "must be between 0 and 1,024"),
    (["startup", "--l2-mib", "99999999"], "must be between 1 and 4,096"),
    (["startup", "--memory-gib", "0"], "must be between 1 and 4,096"),
    (["plan", "x", "--tp", "-1"], "must be between 1 and 1,024"),
    (["startup", "--device", "cpu:5"], "'cpu:5' is not a device"),
    (["startup", "--device", "tpu"], "'tpu' is not a device"),
    (["plan", "x", "--split-dim", "-1"], "'-1' must be between 0 and 64"),
    (["plan", "x", "--split-dim", "65"], "'65' must be between 0 and 64"),
    (["plan", "x", "--split-dim", "1.5"], "'1.5' is not a whole number"),
    # ASCII digits only: int() reads a fullwidth "９" as 9, no operator means it.
    (["startup", "--race-jobs", "\uff19"], "'\uff19' is not a whole number"),
    (
        ["plan", "x", "--tp", "9" * 100_000],
        "'9999999999999999999999...[100,000 chars]' must be between 1 and 1,024",
    ),
    (["startup", "--device", "cuda:0\n\u202etpu"], "'cuda:0\\n\\u202etpu' is not a device"),
    # Issue 41: each passed the old pattern and reached torch.device, a traceback on a GPU.
    (["startup", "--device", "cuda:007"], "'cuda:007' is not a device"),
    (["check", "--device", "cuda:0\n"], "'cuda:0\\n' is not a device"),
    (["startup", "--device", "cuda:\u0663"], "'cuda:\u0663' is not a device"),
    (["check", "--device", "cuda:\uff10"], "'cuda:\uff10' is not a device"),
    (["plan", "x", "--profile", "z" * 10_000_000], "invalid choice: 'zzzz"),
]


def billion_laughs() -> str:
    """A billion-laughs YAML alias bomb: 376 bytes (the report's was 469), 9^9 strings expanded."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join([*lines, "plugins: {l2evict: {exclude: *i}}", ""])


def bad_configs(tmp: Path, wanted: set[str] | None = None) -> dict[str, Path]:
    """Write the bad deployment configs (only ``wanted`` ones: two are 1 MB, one 10 MB)."""
    configs = {
        "cfg_window": ("w.toml", "[plugins.l2evict]\nwindow = 1\n"),
        "cfg_plugins": ("p.json", '{"plugins": ["l2evict"]}'),
        "cfg_self_alias": ("self.yaml", "plugins:\n  l2evict:\n    exclude: &a [*a]\n"),
        "cfg_bomb": ("bomb.yaml", billion_laughs()),
        "cfg_int_key": ("int.yaml", "plugins:\n  l2evict:\n    1: 2\n"),
        "cfg_many_keys": (
            "many.json",
            json.dumps({"plugins": {"l2evict": {f"k{i}": i for i in range(10_000)}}}),
        ),
        "cfg_sixty_keys": (  # under the 64-key cap: each key judged, three named
            "sixty.json",
            json.dumps({"plugins": {"l2evict": {f"k{i}": i for i in range(60)}}}),
        ),
        # Just under the 1 MiB a config may have: parsed, and the echo is still bounded.
        "cfg_long_value": ("long.toml", f'[plugins.l2evict]\nwindow = "{"x" * 1_000_000}"\n'),
        "cfg_long_key": ("longkey.toml", f'[plugins.l2evict]\n"{"k" * 1_000_000}" = 1\n'),
        "cfg_huge": ("huge.toml", f'[plugins.l2evict]\nwindow = "{"x" * 10_000_000}"\n'),
    }
    written = {}
    for name, (file, text) in configs.items():
        if wanted is None or name in wanted:
            (tmp / file).write_text(text)
            written[name] = tmp / file
    return written


@pytest.mark.parametrize(("argv", "line"), CLI_CASES, ids=[c[1][:40] for c in CLI_CASES])
def test_cli_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    files = bad_files(tmp_path)
    files["index"].write_text("{not json")
    files |= bad_configs(tmp_path, set(re.findall(r"{(\w+)}", " ".join(argv))))
    names = {k: str(v) for k, v in files.items()} | {"tmp": str(tmp_path)}
    code = main([a.format(**names) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and line in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert len(err.encode()) <= 1024


@pytest.mark.parametrize(("argv", "line"), ARGPARSE_CASES, ids=[c[1] for c in ARGPARSE_CASES])
def test_absurd_flags_are_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and line in err
    assert all(len(row.encode()) <= 1024 for row in err.splitlines(keepends=True))


@pytest.mark.parametrize(
    ("config", "line"),
    [
        ("cfg_bomb", "yaml anchors/aliases are not allowed (line 1)"),
        ("cfg_long_value", 'plugins.l2evict.window = "xxxxxxxxxx'),
        ("cfg_long_key", "kkkkk...[1,000,000 chars]: unknown key"),
        ("cfg_huge", "{path}: 10,000,030 bytes, over the 1,048,576 a deployment config may"),
        ("cfg_many_keys", "holds more than 64 keys (read no further); it takes at most 5"),
        ("cfg_sixty_keys", "; and 57 more"),
    ],
)
def test_huge_configs_give_a_short_line_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, line: str
) -> None:
    """The report: a 469-byte bomb wrote 2.1 GB to stderr in 59 s; a 10 MB value was echoed."""
    path = bad_configs(tmp_path, {config})[config]
    started = time.perf_counter()
    code = main(["check", "--config", str(path)])
    elapsed = time.perf_counter() - started
    out, err = capsys.readouterr()
    # The path as every error echoes a value: cut past 200 characters, under a long TMPDIR too.
    assert code == 2 and out == "" and line.format(path=shown(str(path))) in err
    assert len(err.encode()) < 1024 and err.count("\n") == 1
    assert elapsed < 10  # seconds; parsing the 10 MB files is most of it


def test_plan_and_safetensors_agree_on_a_gap(tmp_path: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    with pytest.raises(SafetensorError):
        load_file(str(bad_files(tmp_path)["gap"]))


def test_a_device_torch_refuses_is_a_usage_error_not_a_traceback() -> None:
    # The pattern is checked first; whatever still reaches torch and is refused there is the
    # same one-line usage error (exit 2), never torch's traceback read as "falls back".
    from flare_l2evict.tools.cli._shared import usable_device

    with pytest.raises(L2EvictError, match=r"--device cpu:-1: not a device torch knows \("):
        usable_device("cpu:-1")
