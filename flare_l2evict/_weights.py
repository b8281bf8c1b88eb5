"""Choose the resident weights the eviction reads: torch storages in, :mod:`._decision` decides."""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, overload

import torch

from ._decision import _NAMED, BORROWED_WORDS, RegionChoice, Storages
from ._errors import WeightsError
from ._log import say
from ._text import described_value, shown

log = logging.getLogger("flare_l2evict.source")

# Unbound C methods, mapped over whole lists at C speed; typed loosely for that use. Being
# the C functions, they also ignore a subclass's overrides: a storage cannot say it holds
# more than it does.
_storage_of: Callable[[Any], torch.UntypedStorage] = torch.Tensor.untyped_storage
_storage_pointer: Callable[[Any], int] = torch.UntypedStorage.data_ptr
_storage_nbytes: Callable[[Any], int] = torch.UntypedStorage.nbytes
_storage_resizable: Callable[[Any], bool] = torch.UntypedStorage.resizable

BORROWED = "borrowed"
"""The skip reason of a storage that does not own its memory (see :func:`storages_of`)."""
FILE_MAPPED = "file-mapped"
"""The skip reason of a borrowed CPU storage whose memory is a file's mapping (an mmap)."""

MAX_TENSORS = 250_000
"""More resident tensors than any checkpoint shard holds (DeepSeek V3: ~92,000 in all).

The hook's worst case grows linearly with it (5.2 s at the limit on the CI
machine: ``benchmarks/hook_at_limits.py``).
"""
MAX_NAME_CHARS = 16 << 20
"""Characters all resident tensor names may hold together: 250,000 names of 67 each."""
_NAME_CHUNK = 1024


@dataclass(frozen=True)
class WeightPiece:
    """Bytes ``[offset, offset + nbytes)`` of ``storage`` that the eviction reads (whole words)."""

    storage: torch.UntypedStorage = field(repr=False)
    offset: int
    nbytes: int
    tensor: torch.Tensor | None = field(default=None, repr=False, compare=False)
    """The host's tensor this piece was chosen through; the eviction checks it still views it."""


@dataclass(frozen=True)
class WeightRegion:
    """One region of device memory the eviction reads, named by its largest storage's tensor."""

    name: str
    nbytes: int
    pieces: tuple[WeightPiece, ...]


@dataclass(frozen=True)
class WeightChoice:
    """The regions to read, largest first; together they cover ``window_bytes``.

    Invariant: every piece lies on ``device`` inside a non-empty storage viewed by
    no excluded tensor name, starts on a float32 boundary, and shares no byte
    with any other piece.
    """

    regions: tuple[WeightRegion, ...]
    window_bytes: int
    device: torch.device

    @property
    def name(self) -> str:
        return self.regions[0].name

    @property
    def total_bytes(self) -> int:
        return sum(region.nbytes for region in self.regions)

    @property
    def read_bytes(self) -> int:
        return sum(piece.nbytes for region in self.regions for piece in region.pieces)


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one, reading an index-less ``cuda`` as the current device."""
    if a.type != b.type:
        return False
    if a.type == "cuda":
        index_a = torch.cuda.current_device() if a.index is None else a.index
        index_b = torch.cuda.current_device() if b.index is None else b.index
        return index_a == index_b
    return a.index == b.index or a.index is None or b.index is None


def _storages(
    names: list[str], values: list[object]
) -> tuple[list[torch.UntypedStorage | None], bool]:
    """Each tensor's storage (``None`` where it has none) and whether all had one."""
    # A subclass's __torch_function__ could answer untyped_storage() with memory only the
    # plugin would hold (a lazily built copy): with it disabled, the answer is the tensor's own.
    with torch._C.DisableTorchFunctionSubclass():
        return _each_storage(names, values)


def _each_storage(
    names: list[str], values: list[object]
) -> tuple[list[torch.UntypedStorage | None], bool]:
    try:
        # C-level iteration, one call per tensor: a 100,000-tensor checkpoint stays fast.
        return list(map(_storage_of, values)), True
    except Exception:
        pass
    found: list[torch.UntypedStorage | None] = []
    for name, value in zip(names, values, strict=True):
        if not isinstance(value, torch.Tensor):
            raise WeightsError(
                f"resident tensor {name!r:.200} is a {type(value).__name__}, not a torch.Tensor; "
                "fix: the host's resident_tensors() must map names to tensors"
            )
        try:
            found.append(_storage_of(value))
        except Exception:  # tensor subclasses without a plain storage are not readable
            found.append(None)
    return found, False


class ResidentStorages(Sequence["torch.UntypedStorage | None"]):
    """Each resident tensor's storage (``None`` where unreadable), with the tensor itself."""

    def __init__(
        self, names: list[str], storages: list[torch.UntypedStorage | None], tensors: list[object]
    ) -> None:
        self.names = names
        self.storages = storages
        self.tensors = tensors
        self.borrowed: dict[int, None] = {}  # insertion-ordered set
        self.mapped: dict[int, None] = {}  # of those, memory mapped from a file

    def __len__(self) -> int:
        return len(self.storages)

    @overload
    def __getitem__(self, index: int, /) -> torch.UntypedStorage | None: ...

    @overload
    def __getitem__(self, index: slice, /) -> Sequence[torch.UntypedStorage | None]: ...

    def __getitem__(
        self, index: int | slice, /
    ) -> torch.UntypedStorage | Sequence[torch.UntypedStorage | None] | None:
        return self.storages[index]

    def tensor(self, index: int) -> torch.Tensor | None:
        found = self.tensors[index]
        return found if isinstance(found, torch.Tensor) else None


def borrowed_line(names: Sequence[str], count: int, *, mapped: bool = False) -> str:
    """One line naming (bounded) the tensors whose storage borrows memory, with the fix."""
    listed = ", ".join(shown(repr(name), 80) for name in names[:_NAMED])
    more = f" and {count - _NAMED:,} more" if count > _NAMED else ""
    what, fix = BORROWED_WORDS[FILE_MAPPED if mapped else BORROWED]
    return (
        f"{count:,} resident tensors are not read because their storage borrows memory "
        f"({what}), which its owner can free, move or unmap under the eviction: "
        f"{listed}{more}; fix: {fix}"
    )


def _file_spans() -> tuple[list[int], list[int]]:
    """The starts and ends of the process's file-backed mappings (``/proc/self/maps``)."""
    spans = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for fields in map(str.split, maps):
                if len(fields) >= 6 and fields[5].startswith("/"):  # a path: a file's pages
                    low, _, high = fields[0].partition("-")
                    spans.append((int(low, 16), int(high, 16)))
    except (OSError, ValueError):
        return [], []
    spans.sort()
    return [low for low, _ in spans], [high for _, high in spans]


class _FileSpans:
    """:func:`_file_spans`, read when first asked (only a borrowed CPU storage asks)."""

    def __init__(self) -> None:
        self._spans: tuple[list[int], list[int]] | None = None

    def hold(self, address: int) -> bool:
        if self._spans is None:
            self._spans = _file_spans()
        starts, ends = self._spans
        at = bisect_right(starts, address) - 1
        return at >= 0 and address < ends[at]


def storages_of(
    tensors: Mapping[str, torch.Tensor], device: torch.device
) -> tuple[Storages, ResidentStorages]:
    """The decision's view of ``tensors`` (sizes, address ranges, skips), and their storages.

    A storage that does not own its memory (``resizable() == False``: a slice,
    ``from_blob``, DLPack, IPC) is skipped as ``"borrowed"`` (``"file-mapped"`` for a
    CPU file mapping): its owner could free or move the memory under the eviction.
    """
    names, values = _names_and_values(tensors)
    storages, complete = _storages(names, values)
    sizes = _storage_sizes(storages) if complete else None
    if sizes is None:
        storages = [s if _readable(s) else None for s in storages]
        sizes = [0 if s is None else _storage_nbytes(s) for s in storages]
    verdicts: dict[torch.device, str | None] = {}
    held = ResidentStorages(names, storages, values)
    files = _FileSpans()

    def skip(index: int) -> str | None:
        storage = storages[index]
        if storage is None or not _readable(storage):
            return "no storage"
        try:
            owns = bool(_storage_resizable(storage))
        except Exception:
            owns = False
        if not owns:
            held.borrowed[index] = None
            if storage.device.type == "cpu" and files.hold(_storage_pointer(storage)):
                held.mapped[index] = None
                return FILE_MAPPED
            return BORROWED
        found = storage.device
        if found not in verdicts:
            if found.type == "meta":
                verdicts[found] = "meta"
            else:
                verdicts[found] = None if same_device(found, device) else "other device"
        return verdicts[found]

    # Columns asked only for the largest storages: all 100,000 of a checkpoint up front
    # would cost more than the choice.
    starts = _PerIndex(len(storages), lambda index: _start(storages[index]))
    return Storages(names, sizes, starts, _PerIndex(len(storages), skip)), held


def _names_and_values(tensors: Mapping[str, torch.Tensor]) -> tuple[list[str], list[object]]:
    """The mapping's names (plain ``str``) and values, bounded by :data:`MAX_TENSORS`."""
    names = _bounded_names(tensors)
    if not names:
        raise WeightsError(
            "no resident checkpoint tensors; fix: the host must call before_first_capture "
            "after the checkpoint is loaded onto the device"
        )
    if set(map(type, names)) != {str}:
        odd = next((n for n in names if not isinstance(n, str)), None)
        if odd is not None:
            raise WeightsError(
                f"resident tensor name {described_value(odd)} has type {type(odd).__name__}, "
                "not str; fix: the host's resident_tensors() must map names (str) to tensors"
            )
        # str subclasses of the host's: plain copies, so ordering and echoes are str's own.
        names = [str.__str__(name) for name in names]
    values: list[object] = list(islice(tensors.values(), len(names)))
    if len(values) != len(names):
        raise WeightsError(
            "resident_tensors() gave fewer values than names; fix: return a plain mapping"
        )
    return names, values


def _bounded_names(tensors: Mapping[str, torch.Tensor]) -> list[Any]:
    """The mapping's keys, refused past :data:`MAX_TENSORS` names or :data:`MAX_NAME_CHARS`."""
    keys = iter(tensors)
    found: list[Any] = []
    chars = 0
    while chunk := list(islice(keys, _NAME_CHUNK)):
        try:
            # The unbound C method: a str subclass cannot under-report its length.
            chars += sum(map(str.__len__, chunk))
        except TypeError:
            return found + chunk
        found += chunk
        if len(found) > MAX_TENSORS:
            raise WeightsError(
                f"resident_tensors() holds more than {MAX_TENSORS:,} names; fix: the host must "
                "return this rank's checkpoint tensors, by name"
            )
        if chars > MAX_NAME_CHARS:
            raise WeightsError(
                f"resident_tensors()'s names hold more than {MAX_NAME_CHARS:,} characters "
                f"(after {len(found):,} names; a checkpoint's names are under 100 characters "
                "each); fix: the host must return this rank's checkpoint tensors, by name"
            )
    return found


class _PerIndex:
    """A column of :class:`~._decision.Storages` computed on demand, index by index."""

    def __init__(self, size: int, read: Callable[[int], Any]) -> None:
        self._size = size
        self._read = read

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int, /) -> Any:
        return self._read(index)


def _storage_sizes(storages: list[torch.UntypedStorage | None]) -> list[int] | None:
    try:
        return list(map(_storage_nbytes, storages))
    except Exception:  # a wrapper subclass's storage: sized one by one below
        return None


def _readable(storage: torch.UntypedStorage | None) -> bool:
    """Whether the storage has bytes a kernel can read (wrapper subclasses' storages have none)."""
    if storage is None:
        return False
    try:
        _storage_pointer(storage)
        _storage_nbytes(storage)
    except Exception:
        return False
    return True


def _start(storage: torch.UntypedStorage | None) -> int:
    return 0 if storage is None else _storage_pointer(storage)


def weight_choice(
    choice: RegionChoice, storages: Sequence[torch.UntypedStorage | None], device: torch.device
) -> WeightChoice:
    """The decision's regions as torch storages to read."""
    held = storages if isinstance(storages, ResidentStorages) else None
    regions = []
    for source in choice.regions:
        pieces = []
        for piece in source.pieces:
            storage = storages[piece.owner]
            assert storage is not None  # the decision reads only storages that exist
            tensor = None if held is None else held.tensor(piece.owner)
            pieces.append(WeightPiece(storage, piece.offset, piece.nbytes, tensor))
        regions.append(WeightRegion(source.name, source.storage_bytes, tuple(pieces)))
    if held is not None:
        others = [i for i in held.borrowed if i not in held.mapped]
        for mapped, indices in ((False, others), (True, list(held.mapped))):
            if indices:
                names = [held.names[i] for i in indices[:_NAMED]]
                line = borrowed_line(names, len(indices), mapped=mapped)
                say(log, logging.INFO, "flare_l2evict: %s", line)
    return WeightChoice(tuple(regions), choice.window_bytes, device)
