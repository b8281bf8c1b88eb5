"""Read safetensors headers only: a file, several files, or a ``model.safetensors.index.json``.

A header is accepted exactly when safetensors' own loader would accept it
(``safetensors/src/tensor.rs``: ``MAX_HEADER_SIZE``, ``read_metadata``,
``Metadata::validate``, its serde types and serde_json's parser), so that
``plan`` and ``check`` never credit a checkpoint that start-up refuses.
``tests/test_headers.py`` holds each rule against the installed loader.

A checkpoint's files are identities, not names: the same file given twice,
through another path, a symlink or an index alias, is read and counted once.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import stat
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, cast

from .._errors import CheckpointError
from .._text import shown

MAX_HEADER_BYTES = 100_000_000
"""safetensors' ``MAX_HEADER_SIZE``: its loader refuses a longer header."""
MAX_JSON_DEPTH = 127
"""Levels of nesting serde_json parses; it refuses the 128th (its recursion limit)."""
MAX_INDEX_BYTES = 100_000_000
"""An index this large names tens of millions of tensors: a wrong file, not a checkpoint."""


def missing_checkpoint(path: Path) -> CheckpointError:
    """The one line for a checkpoint path that does not exist, in every command alike."""
    return CheckpointError(
        f"{shown(str(path))}: no such checkpoint file; fix: check the path, and pass the "
        "checkpoint's .safetensors files or its model.safetensors.index.json"
    )


_USIZE_MAX = (1 << 64) - 1
_I64_MIN = -(1 << 63)
_F64_OVERFLOW = 2**1024 - 2**970
"""The smallest integer that rounds to an infinite f64."""
_DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}  # fmt: skip
"""Bits per element of every dtype safetensors' loader (0.8) accepts and torch can load.

The Rust loader also knows F6_E2M3 and F6_E3M2, but ``safetensors.torch`` refuses
them ("Dtype not understood"), so start-up could not load such a checkpoint and
``plan`` must not credit it; a test loads one tensor of every dtype listed here.
"""
_FIELDS = ("dtype", "shape", "data_offsets")
# serde_json refuses a lone surrogate escape anywhere, even in an ignored value;
# only documents with such an escape need the walk that finds one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class TensorHeader(NamedTuple):
    """One tensor as its header describes it; ``nbytes`` is its span in the file.

    ``file`` is the resolved path of the file that holds it.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str


class _Pairs(list[tuple[str, object]]):
    """A JSON object as its (key, value) pairs, duplicates kept: serde refuses some."""


class _Entry(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _integer(text: str) -> int | float:
    """A JSON integer as serde_json reads it.

    It reads ``-0`` and integers beyond u64 (or below i64) as floats, which no
    ``usize`` field takes, and refuses one beyond f64's range. Long literals
    skip ``int()``, which Python refuses past 4,300 digits.
    """
    if len(text) <= 21:
        value = int(text)
        if value == 0 and text.startswith("-"):
            return -0.0
        if _I64_MIN <= value <= _USIZE_MAX:
            return value
    return _float(text)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range ({shown(text, 40)})")
    return value


def _constant(text: str) -> object:
    raise ValueError(f"{text} is not JSON")


def _kind(value: object) -> str:
    """The JSON type of a parsed value, for messages."""
    if isinstance(value, _Pairs):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"


def _walk(value: object, depth: int) -> Iterator[tuple[object, int]]:
    """Every value nested in ``value`` (and object keys), with its nesting depth; iterative."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        yield item, level
        if isinstance(item, _Pairs):
            for key, entry in item:
                yield key, level
                stack.append((entry, level + 1))
        elif isinstance(item, list):
            stack.extend((entry, level + 1) for entry in item)


def _ignored(value: object, depth: int) -> None:
    """A value serde parses and then ignores (an unknown field): only the parser's limits apply."""
    for item, level in _walk(value, depth):
        if isinstance(item, list) and level > MAX_JSON_DEPTH:
            raise ValueError(f"nests deeper than {MAX_JSON_DEPTH} levels, serde_json's limit")
        if type(item) is int and abs(item) >= _F64_OVERFLOW:
            raise ValueError("number out of range")  # serde_json reads it as an f64


def _parse(raw: bytes, what: str, *, serde: bool = False) -> object:
    """Parse JSON as serde_json would, or raise ``ValueError``.

    Objects come back as :class:`_Pairs` so that repeated keys stay visible.
    Nesting is checked only where a header may nest freely (unknown fields,
    :func:`_ignored`); everywhere else serde's types bound it.
    """
    try:
        text = raw.decode("utf-8")  # strict: json.loads would also take UTF-16 or a BOM
    except UnicodeDecodeError as error:
        raise ValueError(f"{what} is not UTF-8 (byte {error.start:,})") from None
    try:
        document = json.loads(
            text,
            object_pairs_hook=_Pairs,
            # Every integer through a Python hook costs 40% more time; only "-0"
            # needs it, which serde reads as a float, and it is rare.
            parse_int=_integer if "-0" in text else None,
            parse_float=_float,
            parse_constant=_constant,
        )
    except RecursionError:
        # A header deeper than serde_json's limit is refused by the loader;
        # an index is read by Python's json, whose own limit this is.
        limit = (
            f"deeper than {MAX_JSON_DEPTH} levels, serde_json's limit" if serde else "too deeply"
        )
        raise ValueError(f"{what} nests {limit}") from None
    if _SURROGATE_ESCAPE.search(text):
        for item, _ in _walk(document, 1):
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"{what} has a lone surrogate escape") from None
    return document


def _usizes(values: object) -> bool:
    """``values`` is a JSON array of integers serde reads as ``usize``."""
    if type(values) is not list:
        return False
    for value in values:
        if type(value) is not int or not 0 <= value <= _USIZE_MAX:
            return False
    return True


def _dtype(value: object) -> str:
    # serde reads an enum's unit variant from "F32" or from {"F32": null}.
    if isinstance(value, _Pairs) and len(value) == 1 and value[0][1] is None:
        value = value[0][0]
    if not isinstance(value, str) or value not in _DTYPE_BITS:
        what = f"'{shown(value, 40)}'" if isinstance(value, str) else f"a JSON {_kind(value)}"
        raise ValueError(f"unknown dtype {what}")
    return value


def _entry(value: object) -> _Entry:
    """One tensor's entry, with serde's types: an object (unknown keys ignored) or [d, s, o]."""
    if type(value) is _Pairs and len(value) == 3:
        (k0, dtype), (k1, shape), (k2, offsets) = value
        if k0 != "dtype" or k1 != "shape" or k2 != "data_offsets":
            dtype, shape, offsets = _fields(value)
    elif type(value) is _Pairs:
        dtype, shape, offsets = _fields(value)
    elif type(value) is list:
        if len(value) != 3:
            raise ValueError(f"{len(value)} elements where dtype, shape, data_offsets are 3")
        dtype, shape, offsets = value
    else:
        raise ValueError(f"a {_kind(value)} where an object with dtype, shape, data_offsets goes")
    if not _usizes(shape):
        raise ValueError("shape must be a list of whole numbers in 0..2^64-1")
    if not _usizes(offsets) or len(cast("list[int]", offsets)) != 2:
        raise ValueError("data_offsets must be [begin, end], whole numbers in 0..2^64-1")
    begin, end = cast("list[int]", offsets)
    return _Entry(_dtype(dtype), tuple(cast("list[int]", shape)), begin, end)


def _fields(value: _Pairs) -> tuple[object, object, object]:
    """dtype, shape and data_offsets of an entry in any key order, with unknown keys."""
    fields: dict[str, object] = {}
    for key, item in value:
        if key in _FIELDS:
            if key in fields:
                raise ValueError(f"duplicate field {key!r}")
            fields[key] = item
        else:
            _ignored(item, 3)
    missing = [name for name in _FIELDS if name not in fields]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    return fields["dtype"], fields["shape"], fields["data_offsets"]


def _metadata(value: object) -> None:
    """``__metadata__``: null, or an object of strings (safetensors' ``Option<HashMap>``)."""
    if value is None:
        return
    if not isinstance(value, _Pairs) or not all(isinstance(v, str) for _, v in value):
        raise ValueError("__metadata__ must map strings to strings")


def _nbytes(entry: _Entry) -> int:
    """Bytes of a tensor, refusing what safetensors' checked arithmetic refuses."""
    elements = math.prod(entry.shape)
    if elements > _USIZE_MAX or 0 in entry.shape:
        # safetensors multiplies dim by dim with overflow checks: [2^40, 2^40, 0] is refused.
        running = 1
        for dim in entry.shape:
            running *= dim
            if running > _USIZE_MAX:
                raise ValueError(f"shape {list(entry.shape)} overflows 64 bits")
    bits = elements * _DTYPE_BITS[entry.dtype]
    if bits > _USIZE_MAX:
        raise ValueError(f"shape {list(entry.shape)} overflows 64 bits")
    if bits % 8 or bits // 8 != entry.end - entry.begin:
        # Grouped digits as the offsets beside it, never 3.35544e+07; a part byte as bits.
        needs = f"{bits // 8:,} bytes" if bits % 8 == 0 else f"{bits:,} bits, not whole bytes"
        raise ValueError(
            f"{entry.dtype} {list(entry.shape)} needs {needs}, the offsets span "
            f"{entry.end - entry.begin:,}"
        )
    return bits // 8


def _tensors(document: object, data_bytes: int, file: str) -> list[TensorHeader]:
    """The tensors a parsed header declares, checked as ``Metadata`` and ``validate`` check them."""
    where = shown(file)
    if not isinstance(document, _Pairs):
        raise CheckpointError(f"{where}: corrupt safetensors header (not a JSON object)")
    entries: dict[str, _Entry] = {}
    metadata_seen = False
    for name, value in document:
        try:
            if name == "__metadata__":
                if metadata_seen:
                    raise ValueError("duplicate field '__metadata__'")
                metadata_seen = True
                _metadata(value)
            else:
                # serde checks every occurrence of a repeated name; the last one stands.
                entries[name] = _entry(value)
        except ValueError as error:
            at = "" if name == "__metadata__" else f" at '{shown(name, 80)}'"
            raise CheckpointError(
                f"{where}: corrupt safetensors header{at} ({error}); fix: re-export or "
                "re-download the file"
            ) from None
    tensors = []
    for name, entry in entries.items():
        try:
            if not entry.begin <= entry.end <= data_bytes:
                raise ValueError(
                    f"bytes {entry.begin:,}..{entry.end:,} outside the {data_bytes:,} data bytes"
                )
            nbytes = _nbytes(entry)
        except ValueError as error:
            raise CheckpointError(
                f"{where}: corrupt safetensors header at '{shown(name, 80)}' ({error}); fix: "
                "re-export or re-download the file"
            ) from None
        tensors.append(TensorHeader(name, entry.dtype, entry.shape, nbytes, file))
    _check_layout(where, sorted((e.begin, e.end) for e in entries.values()), data_bytes)
    return tensors


def _check_layout(where: str, spans: list[tuple[int, int]], data_bytes: int) -> None:
    """Tensors must tile the data section exactly, as safetensors' loader requires."""
    position = 0
    for begin, end in spans:
        if begin != position:
            raise CheckpointError(
                f"{where}: corrupt safetensors header (tensor data at byte {begin:,} where "
                f"{position:,} was expected: gap or overlap); fix: re-export the checkpoint"
            )
        position = end
    if position != data_bytes:
        raise CheckpointError(
            f"{where}: corrupt safetensors header (tensors cover {position:,} of the "
            f"{data_bytes:,} data bytes); fix: re-export or re-download the file"
        )


class _File(NamedTuple):
    key: tuple[int, int]
    """``(st_dev, st_ino)`` of the file read: the file's identity."""
    path: Path
    """Its resolved path, for messages."""


def _open(path: Path, what: str) -> tuple[_File, int, bytes]:
    """The file's identity, its size and its header bytes, read from one open handle."""
    where = shown(str(path))
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise CheckpointError(
                f"{where}: is a directory, not a {what}; fix: pass its .safetensors files or "
                "its model.safetensors.index.json"
            )
        if not stat.S_ISREG(mode):  # a FIFO or a device would block or never end
            raise CheckpointError(f"{where}: not a regular file; fix: pass a .safetensors file")
        with path.open("rb") as handle:
            info = os.fstat(handle.fileno())
            file = _File((info.st_dev, info.st_ino), path.resolve())
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(
                    f"{where}: corrupt safetensors header (file shorter than 8 bytes)"
                )
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or 8 + length > info.st_size:
                limit = (
                    f"over safetensors' limit of {MAX_HEADER_BYTES:,}"
                    if length > MAX_HEADER_BYTES
                    else f"in a {info.st_size:,}-byte file"
                )
                raise CheckpointError(
                    f"{where}: corrupt safetensors header (declares {length:,} header bytes "
                    f"{limit}); fix: re-export or re-download the file"
                )
            raw = handle.read(length)
    except (FileNotFoundError, NotADirectoryError):
        if what == "shard":  # the index named it, and it vanished after the index was read
            raise CheckpointError(f"{where}: no such {what}; fix: check the path") from None
        raise missing_checkpoint(path) from None
    except (OSError, ValueError) as error:  # ValueError: a NUL inside the path
        reason = getattr(error, "strerror", None) or str(error)
        raise CheckpointError(f"{where}: cannot read the {what} ({shown(reason)})") from None
    return file, info.st_size - 8 - length, raw


def read_header(path: Path) -> list[TensorHeader]:
    """The tensors of one safetensors file, from its header alone.

    Accepts exactly what safetensors' loader accepts: a header of at most
    100,000,000 bytes of UTF-8 JSON nested at most 127 deep, serde's types
    for every entry, shapes whose byte counts fit 64 bits and match the
    offsets, and tensors that tile the data section. Raises
    :class:`CheckpointError`, one line naming the file and the problem.
    """
    file, data_bytes, raw = _open(path, "safetensors file")
    return _read(file, data_bytes, raw)


def _read(file: _File, data_bytes: int, raw: bytes) -> list[TensorHeader]:
    where = shown(str(file.path))
    try:
        document = _parse(raw, "the header", serde=True)
    except ValueError as error:
        raise CheckpointError(
            f"{where}: corrupt safetensors header ({shown(str(error))}); fix: re-export or "
            "re-download the file"
        ) from None
    return _tensors(document, data_bytes, str(file.path))


def _weight_map(path: Path) -> dict[str, str]:
    """An index's ``weight_map``: tensor name to shard file name, every value a string."""
    where = shown(str(path))
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read below forever
            raise ValueError("not a regular file")
        if info.st_size > MAX_INDEX_BYTES:
            raise ValueError(f"over {MAX_INDEX_BYTES:,} bytes")
        with path.open("rb") as handle:
            raw = handle.read(MAX_INDEX_BYTES + 1)
        if len(raw) > MAX_INDEX_BYTES:  # it grew after the check
            raise ValueError(f"over {MAX_INDEX_BYTES:,} bytes")
        index = _parse(raw, "the file")
        if not isinstance(index, _Pairs):
            raise ValueError(f"a JSON {_kind(index)}, not an object")
        found = [value for key, value in index if key == "weight_map"]
        if not found:
            raise ValueError("no weight_map")
        if not isinstance(found[-1], _Pairs):
            raise ValueError(f"weight_map is a JSON {_kind(found[-1])}, not an object")
    except FileNotFoundError:
        raise missing_checkpoint(path) from None
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise CheckpointError(f"{where}: not a safetensors index ({shown(reason)})") from None
    weight_map: dict[str, str] = {}
    for name, shard in found[-1]:
        if not isinstance(shard, str):
            raise CheckpointError(
                f"{where}: weight_map['{shown(name, 80)}'] is a JSON {_kind(shard)}, not a "
                "shard file name; fix: point at a complete index"
            )
        weight_map[name] = shard
    if not weight_map:
        raise CheckpointError(
            f"{where}: the index names no tensors; fix: point at a complete index"
        )
    return weight_map


def read_checkpoint(paths: Sequence[Path]) -> list[TensorHeader]:
    """Headers of one checkpoint given as files and/or index files.

    Each file is read once however it is reached (another spelling of its
    path, a symlink, a hard link, an index alias, given twice), identified by
    ``(st_dev, st_ino)``. A file given directly contributes all its tensors;
    through an index, the tensors the index names in it, each of which it
    must hold. A tensor name held by two different files is an error.
    """
    with _no_gc():
        return _read_checkpoint(paths)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while headers are parsed.

    Parsing makes millions of small containers and no cycles; the collector's
    repeated passes over them cost twice the parsing itself (90,000 tensors:
    0.95 s with it, 0.45 s without).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_checkpoint(paths: Sequence[Path]) -> list[TensorHeader]:
    files: dict[tuple[int, int], list[TensorHeader]] = {}
    # Per file: None for every tensor (given directly), else the tensors indexes
    # name in it, each with the index and the shard name that named it.
    wanted: dict[tuple[int, int], dict[str, tuple[Path, str]] | None] = {}

    def load(path: Path, what: str) -> tuple[int, int]:
        file, data_bytes, raw = _open(path, what)
        if file.key not in files:
            files[file.key] = _read(file, data_bytes, raw)
        return file.key

    for path in paths:
        if path.name.endswith(".index.json"):
            by_shard: dict[str, list[str]] = {}
            for name, shard in _weight_map(path).items():
                by_shard.setdefault(shard, []).append(name)
            for shard in sorted(by_shard):
                key = _shard(path, shard, load)
                selection = wanted.setdefault(key, {})
                if selection is not None:
                    for name in by_shard[shard]:
                        selection.setdefault(name, (path, shard))
        else:
            wanted[load(path, "safetensors file")] = None
    tensors: list[TensorHeader] = []
    holder: dict[str, tuple[tuple[int, int], str]] = {}
    for key, headers in files.items():
        selection = wanted[key]
        if selection is not None:
            held = {t.name for t in headers}
            absent = sorted(name for name in selection if name not in held)
            if absent:
                index, shard = selection[absent[0]]
                raise CheckpointError(
                    f"{shown(str(index))}: names tensor '{shown(absent[0], 80)}' in shard "
                    f"'{shown(shard, 80)}', which does not hold it; fix: re-download the index "
                    "and its shards together"
                )
            headers = [t for t in headers if t.name in selection]
        for t in headers:
            other_key, other = holder.setdefault(t.name, (key, t.file))
            if other_key != key:
                raise CheckpointError(
                    f"tensor '{shown(t.name, 80)}' is in two files: {shown(other)} and "
                    f"{shown(t.file)}; fix: pass each shard once, from one checkpoint"
                )
        tensors.extend(headers)
    if not tensors:
        shown_paths = shown(", ".join(map(str, paths)))
        one = len(paths) == 1
        raise CheckpointError(
            f"{shown_paths}: {'its header declares' if one else 'their headers declare'} no "
            "tensors, so there are no weights to read; fix: pass the checkpoint files that hold "
            "the model's weights (a file saved from an empty state dict holds none)"
        )
    return tensors


def _shard(
    index: Path, shard: str, load: Callable[[Path, str], tuple[int, int]]
) -> tuple[int, int]:
    """Read a shard an index names, relative to the index's folder (never outside it)."""
    # An index names shards by file name (Hugging Face writes them so): an absolute path
    # or one through ".." would read files the operator never pointed at.
    if Path(shard).is_absolute() or ".." in Path(shard).parts or shard.startswith("~"):
        raise CheckpointError(
            f"{shown(str(index))}: shard '{shown(shard, 80)}' named in the index lies outside the "
            "index's folder (an absolute path or ..); fix: name each shard by its file name "
            "beside the index"
        )
    path = index.parent / shard
    try:
        mode: int | None = os.stat(path).st_mode
    except (OSError, ValueError):
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # /dev/zero, a FIFO: present, not a shard
        raise CheckpointError(
            f"{shown(str(index))}: shard '{shown(shard, 80)}' named in the index is not a "
            "regular file (a directory, FIFO or device); fix: point the index at the "
            "checkpoint's .safetensors files"
        )
    if mode is None:
        raise CheckpointError(
            f"{shown(str(index))}: shard '{shown(shard, 80)}' named in the index is missing from "
            f"{shown(str(index.parent))}; fix: download the whole checkpoint"
        )
    return load(path, "shard")


def refuse_non_safetensors(paths: Sequence[Path]) -> None:
    """Refuse, by name, a file that plainly is not safetensors (text or JSON, not an index).

    A safetensors file starts with its header's length, 8 little-endian bytes;
    8 bytes of printable text declare over 2**56 header bytes, which no file
    has. So text there is never a checkpoint, and a JSON file is most likely
    an index not named ``*.index.json`` (only that name is read as an index):
    telling the operator to re-download it would send them after a good file.
    Files that cannot be opened are left to the reader's own messages.
    """
    for path in paths:
        if path.name.endswith(".index.json"):
            continue
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
                continue
            with path.open("rb") as handle:
                head = handle.read(8)
        except (OSError, ValueError):  # ValueError: a NUL inside the path
            continue
        if not head or not all(byte in _TEXT_BYTES for byte in head):
            continue
        where = shown(str(path))
        if head.lstrip().startswith((b"{", b"[")):
            raise CheckpointError(
                f"{where}: a JSON file, not a safetensors file (an index is read as one only "
                "when its name ends in .index.json); fix: pass the checkpoint's .safetensors "
                "files, or its model.safetensors.index.json"
            )
        raise CheckpointError(
            f"{where}: a text file, not a safetensors file (it starts with "
            f"'{shown(head.decode('ascii'), 20)}'); fix: pass .safetensors files or a "
            "model.safetensors.index.json"
        )


_TEXT_BYTES = frozenset(range(0x20, 0x7F)) | frozenset(b"\t\n\r\f\v")
