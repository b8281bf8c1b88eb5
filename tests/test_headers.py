"""The header reader against safetensors' own loader: it accepts exactly what the loader does.

Every case is a real file on disk, read by both ``safetensors.safe_open``
(the loader start-up uses) and :func:`read_header`; a file the loader refuses
must be refused, so ``plan`` and ``check`` never credit it, and a file the
loader reads must be read.

Case -> outcome (the paths an index names):

- an index naming a shard outside its folder -> refused by name;
- /dev/zero as a shard or as the reference host's checkpoint -> "not a regular
  file", not "missing"; a FIFO index -> the same, never blocks.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from support.checkpoints import sparse_zeros
from support.python_child import run_python

from flare_l2evict import CheckpointError
from flare_l2evict._text import shown
from flare_l2evict.tools import main
from flare_l2evict.tools._headers import (
    MAX_HEADER_BYTES,
    MAX_JSON_DEPTH,
    read_checkpoint,
    read_header,
)
from flare_l2evict.tools.reference_host import load_checkpoint

ENTRY = '"dtype":"F32","shape":[1],"data_offsets":[0,4]'
ONE = '{"a":{' + ENTRY + "}}"


def raw_file(path: Path, header: bytes, data: bytes = bytes(4)) -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def with_extra(value: str) -> bytes:
    """One tensor whose entry carries an unknown key: serde parses it, then ignores it."""
    return ('{"a":{' + ENTRY + ',"x":' + value + "}}").encode()


def shaped(shape: str, offsets: str = "[0,4]", dtype: str = '"F32"') -> bytes:
    fields = f'"dtype":{dtype},"shape":{shape},"data_offsets":{offsets}'
    return ('{"a":{' + fields + "}}").encode()


def with_metadata(value: str) -> bytes:
    return ('{"__metadata__":' + value + ',"a":{' + ENTRY + "}}").encode()


def twice(first: str, second: str) -> bytes:
    """The name "a" given two entries: serde checks both, the last one stands."""
    return ('{"a":{' + first + '},"a":{' + second + "}}").encode()


TWO = '"dtype":"F32","shape":[2],"data_offsets":[0,4]'  # 8 bytes of F32 in a 4-byte span


# (id, header bytes, data bytes): each is read by the loader and by read_header.
CASES: list[tuple[str, bytes, bytes]] = [
    ("plain", ONE.encode(), bytes(4)),
    ("empty header", b"{}", b""),
    ("space padding", ONE.encode() + b"   ", bytes(4)),
    ("leading space", b" " + ONE.encode(), bytes(4)),
    ("NUL padding", ONE.encode() + b"\0\0", bytes(4)),
    ("form feed", b"\f" + ONE.encode(), bytes(4)),
    ("UTF-8 BOM", b"\xef\xbb\xbf" + ONE.encode(), bytes(4)),
    ("UTF-16", ONE.encode("utf-16"), bytes(4)),
    ("invalid UTF-8", with_extra('"?"').replace(b"?", b"\xff"), bytes(4)),
    ("trailing junk", ONE.encode() + b"x", bytes(4)),
    ("top-level array", b"[]", b""),
    ("unknown key", with_extra("1"), bytes(4)),
    ("unknown key, float", with_extra("1.5"), bytes(4)),
    ("unknown key, -0", with_extra("-0"), bytes(4)),
    ("unknown key, 309 digits", with_extra("1" + "0" * 308), bytes(4)),
    ("unknown key, 310 digits", with_extra("1" + "0" * 309), bytes(4)),
    ("unknown key, 5000 digits", with_extra("1" + "0" * 5000), bytes(4)),
    ("unknown key, 1e400", with_extra("1e400"), bytes(4)),
    ("unknown key, NaN", with_extra("NaN"), bytes(4)),
    ("unknown key, repeated", ('{"a":{' + ENTRY + ',"x":1,"x":2}}').encode(), bytes(4)),
    (f"nesting {MAX_JSON_DEPTH}", with_extra(nested(MAX_JSON_DEPTH - 2)), bytes(4)),
    (f"nesting {MAX_JSON_DEPTH + 1}", with_extra(nested(MAX_JSON_DEPTH - 1)), bytes(4)),
    ("nesting 100,000", with_extra(nested(100_000)), bytes(4)),
    ("lone surrogate in a name", ('{"\\ud800":{' + ENTRY + "}}").encode(), bytes(4)),
    ("lone surrogate, ignored", with_extra('"\\udc00"'), bytes(4)),
    ("surrogate pair", with_extra('"\\ud83d\\ude00"'), bytes(4)),
    ("control char in a name", ('{"a\tb":{' + ENTRY + "}}").encode(), bytes(4)),
    ("escaped NUL in a name", ('{"a\\u0000b":{' + ENTRY + "}}").encode(), bytes(4)),
    ("repeated field", ('{"a":{' + ENTRY + ',"dtype":"F32"}}').encode(), bytes(4)),
    ("missing field", b'{"a":{"dtype":"F32","shape":[1]}}', bytes(4)),
    ("entry as array", b'{"a":["F32",[1],[0,4]]}', bytes(4)),
    ("entry as short array", b'{"a":["F32",[1]]}', bytes(4)),
    ("entry as long array", b'{"a":["F32",[1],[0,4],5]}', bytes(4)),
    ("entry null", b'{"a":null}', bytes(4)),
    ("dtype as unit variant", shaped("[1]", dtype='{"F32":null}'), bytes(4)),
    ("dtype as map with a value", shaped("[1]", dtype='{"F32":1}'), bytes(4)),
    ("dtype lower case", shaped("[1]", dtype='"f32"'), bytes(4)),
    ("dtype E8M0", shaped("[4]", dtype='"E8M0"'), bytes(4)),
    ("dtype F8_E4M3FNUZ", shaped("[4]", dtype='"F8_E4M3FNUZ"'), bytes(4)),
    ("dtype F4, whole bytes", shaped("[8]", dtype='"F4"'), bytes(4)),
    ("dtype F4, half a byte", shaped("[3]", "[0,2]", dtype='"F4"'), bytes(2)),
    ("shape float", shaped("[1.0]"), bytes(4)),
    ("shape -0", shaped("[-0]", "[0,0]"), b""),
    ("shape negative", shaped("[-1]"), bytes(4)),
    ("shape bool", shaped("[true]"), bytes(4)),
    ("shape string", shaped('["1"]'), bytes(4)),
    ("shape null", shaped("null"), bytes(4)),
    ("shape object", shaped('{"0":1}'), bytes(4)),
    ("0-d", shaped("[]"), bytes(4)),
    ("dim 2^64-1 times 0", shaped(f"[{2**64 - 1},0]", "[0,0]"), b""),
    ("dim 2^64", shaped(f"[{2**64},0]", "[0,0]"), b""),
    ("dims overflow before a 0", shaped(f"[{2**40},{2**40},0]", "[0,0]"), b""),
    ("dims 0 before an overflow", shaped(f"[0,{2**40},{2**40}]", "[0,0]"), b""),
    ("offsets -0", shaped("[1]", "[-0,4]"), bytes(4)),
    ("offsets float", shaped("[1]", "[0,4.0]"), bytes(4)),
    ("offsets three", shaped("[1]", "[0,4,4]"), bytes(4)),
    ("offsets object", shaped("[1]", '{"0":0,"1":4}'), bytes(4)),
    ("offsets past u64", shaped("[1]", f"[{2**64},{2**64 + 4}]"), bytes(4)),
    ("metadata null", with_metadata("null"), bytes(4)),
    ("metadata empty", with_metadata("{}"), bytes(4)),
    ("metadata int value", with_metadata('{"k":1}'), bytes(4)),
    ("metadata null value", with_metadata('{"k":null}'), bytes(4)),
    ("metadata array", with_metadata("[]"), bytes(4)),
    ("metadata repeated", with_metadata('{},"__metadata__":{}'), bytes(4)),
    ("metadata key repeated", with_metadata('{"k":"1","k":"2"}'), bytes(4)),
    ("name repeated, last fits", twice(TWO, ENTRY), bytes(4)),
    ("name repeated, last does not", twice(ENTRY, TWO), bytes(4)),
    ("name repeated, first malformed", twice('"dtype":"F32"', ENTRY), bytes(4)),
    ("unknown top-level int", ('{"q":1,"a":{' + ENTRY + "}}").encode(), bytes(4)),
    ("gap", shaped("[1]", "[4,8]"), bytes(8)),
    ("short data", ONE.encode(), bytes(3)),
    ("long data", ONE.encode(), bytes(5)),
]


def loader_accepts(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            list(handle.keys())
    except Exception:
        return False
    return True


def ours_accepts(path: Path) -> bool:
    try:
        read_header(path)
    except CheckpointError as error:
        assert "\n" not in str(error) and len(str(error).encode()) < 1024
        return False
    return True


@pytest.mark.parametrize(("header", "data"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_reader_accepts_exactly_what_the_loader_accepts(
    tmp_path: Path, header: bytes, data: bytes
) -> None:
    path = raw_file(tmp_path / "case.safetensors", header, data)
    assert ours_accepts(path) == loader_accepts(path)


def test_the_header_size_limit_is_the_loaders(tmp_path: Path) -> None:
    at_limit = ONE.encode().ljust(MAX_HEADER_BYTES, b" ")
    accepted = raw_file(tmp_path / "at.safetensors", at_limit)
    assert loader_accepts(accepted) and ours_accepts(accepted)
    assert [t.name for t in read_header(accepted)] == ["a"]
    for length in (MAX_HEADER_BYTES + 1, 102_000_000):
        over = tmp_path / f"over-{length}.safetensors"
        with over.open("wb") as handle:  # sparse: only the length and the first bytes are real
            handle.write(struct.pack("<Q", length) + ONE.encode())
            handle.truncate(8 + length + 4)
        assert not loader_accepts(over)
        with pytest.raises(CheckpointError, match=f"declares {length:,} header bytes over"):
            read_header(over)


def test_files_written_by_safetensors_are_read_as_written(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {
        "w": torch.zeros(3, 5, dtype=torch.bfloat16),
        "scalar": torch.tensor(1.0),
        "empty": torch.zeros(0, 7),
        "e4m3": torch.zeros(16, dtype=torch.float8_e4m3fn),
        "name with\nnewline": torch.zeros(2, dtype=torch.int64),
    }
    save_file(tensors, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    found = {t.name: t for t in read_header(tmp_path / "m.safetensors")}
    assert set(found) == set(tensors)
    for name, tensor in tensors.items():
        assert found[name].shape == tuple(tensor.shape)
        assert found[name].nbytes == tensor.numel() * tensor.element_size()


# --- identities: one file, however it is reached, counts once -----------------------------


@pytest.fixture
def shard(write_checkpoint: Callable[..., Path]) -> Path:
    return write_checkpoint({"w": torch.zeros(1024), "b": torch.zeros(8)}, "shard.safetensors")


def test_one_file_reached_five_ways_is_read_once(shard: Path, tmp_path: Path) -> None:
    (tmp_path / "link.safetensors").symlink_to(shard)
    os.link(shard, tmp_path / "hard.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(
        json.dumps({"weight_map": {"w": "shard.safetensors", "b": "./shard.safetensors"}})
    )
    spellings = [shard, tmp_path / "." / "shard.safetensors", tmp_path / "link.safetensors"]
    spellings += [tmp_path / "hard.safetensors", index, shard]
    tensors = read_checkpoint(spellings)
    assert sorted(t.name for t in tensors) == ["b", "w"]
    assert {t.file for t in tensors} == {str(shard.resolve())}


def test_an_index_alias_counts_its_file_once(shard: Path, tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(
        json.dumps({"weight_map": {"w": "shard.safetensors", "b": "./shard.safetensors"}})
    )
    assert sorted(t.name for t in read_checkpoint([index])) == ["b", "w"]


def test_a_file_given_directly_gives_all_its_tensors_even_beside_an_index(
    shard: Path, tmp_path: Path
) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "shard.safetensors"}}))
    assert [t.name for t in read_checkpoint([index])] == ["w"]
    assert sorted(t.name for t in read_checkpoint([index, shard])) == ["b", "w"]
    assert sorted(t.name for t in read_checkpoint([shard, index])) == ["b", "w"]


def test_one_tensor_name_in_two_files_is_one_line(
    write_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    first = write_checkpoint({"w": torch.zeros(4)}, "one.safetensors")
    second = write_checkpoint({"w": torch.zeros(8)}, "two.safetensors")
    with pytest.raises(CheckpointError) as caught:
        read_checkpoint([first, second])
    message = str(caught.value)
    assert message.startswith("tensor 'w' is in two files: ")
    # Each path as every echoed value is: cut past 200 characters (under a long TMPDIR).
    assert shown(str(first.resolve())) in message and shown(str(second.resolve())) in message
    assert "\n" not in message


def test_an_index_naming_a_tensor_its_shard_lacks_is_one_line(shard: Path, tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(
        json.dumps({"weight_map": {"w": "shard.safetensors", "zz": "shard.safetensors"}})
    )
    with pytest.raises(
        CheckpointError, match=r"names tensor 'zz' in shard 'shard\.safetensors', which"
    ):
        read_checkpoint([index])


def test_every_dtype_the_reader_accepts_loads_with_safetensors_torch(tmp_path: Path) -> None:
    """``plan`` credits only checkpoints start-up can load: each dtype, one small tensor."""
    from safetensors.torch import load_file

    from flare_l2evict.tools._headers import _DTYPE_BITS

    for dtype, bits in _DTYPE_BITS.items():
        count = 8  # a whole number of bytes for every width
        nbytes = count * bits // 8
        header = {"w": {"dtype": dtype, "shape": [count], "data_offsets": [0, nbytes]}}
        raw = json.dumps(header).encode()
        path = tmp_path / f"{dtype}.safetensors"
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(nbytes))
        assert read_header(path)[0].nbytes == nbytes
        load_file(str(path))  # raises for a dtype torch's loader does not understand


def test_f6_dtypes_are_refused_as_start_up_would(tmp_path: Path) -> None:
    nbytes = 6
    header = {"w": {"dtype": "F6_E2M3", "shape": [8], "data_offsets": [0, nbytes]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "f6.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(nbytes))
    with pytest.raises(CheckpointError, match="unknown dtype 'F6_E2M3'"):
        read_header(path)


# --- paths: a shard is a regular file inside the index's folder ---------------------------
@pytest.mark.parametrize("shard", ["/etc/hostname", "../outside.safetensors", "a/../../b"])
def test_an_index_cannot_name_a_shard_outside_its_folder(tmp_path: Path, shard: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"w": shard}}))
    with pytest.raises(CheckpointError, match="lies outside the index's folder"):
        read_checkpoint([index])


def test_dev_zero_named_as_a_shard_is_not_missing(tmp_path: Path) -> None:
    (tmp_path / "zero.safetensors").symlink_to("/dev/zero")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "zero.safetensors"}}))
    with pytest.raises(CheckpointError, match="is not a regular file") as raised:
        read_checkpoint([index])
    assert "missing" not in str(raised.value)


def test_a_fifo_index_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "model.safetensors.index.json"
    os.mkfifo(fifo)
    out = run_python(
        "from pathlib import Path\n"
        "from flare_l2evict.tools._headers import read_checkpoint\n"
        "from flare_l2evict._errors import CheckpointError\n"
        "try:\n"
        f"    read_checkpoint([Path({str(fifo)!r})])\n"
        "except CheckpointError as error:\n"
        "    print(error)\n",
        timeout=20,
    )
    assert "not a regular file" in out


def test_dev_zero_as_the_reference_checkpoint_gets_its_own_line() -> None:
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint("/dev/zero", torch.device("cpu"))


@pytest.mark.parametrize("command", ["plan", "check", "startup"])
def test_a_checkpoint_of_no_tensors_is_told_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # Issue 46: it was told to "pass .safetensors files", which it had.
    path = sparse_zeros(tmp_path / "model.safetensors", {})
    assert main([command, str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"error: flare-l2evict {command}: {shown(str(path))}: its header declares no tensors, so "
        "there are no weights to read; fix: pass the checkpoint files that hold the model's "
        "weights (a file saved from an empty state dict holds none)\n"
    )
