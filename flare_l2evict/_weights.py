"""Choose the resident weights the eviction reads: torch storages in, :mod:`._decision` decides."""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import torch

from ._decision import RegionChoice, Storages, borrowed_line
from ._errors import WeightsError
from ._log import say
from ._report import HOST, Wording
from ._text import described_value

log = logging.getLogger("flare_l2evict.weights")

# Unbound C methods (typed loosely), mapped over whole lists at C speed; being the C functions,
# they ignore a subclass's overrides: a storage cannot say it holds more than it does.
_storage_of: Callable[[Any], torch.UntypedStorage] = torch.Tensor.untyped_storage
_storage_pointer: Callable[[Any], int] = torch.UntypedStorage.data_ptr
_storage_nbytes: Callable[[Any], int] = torch.UntypedStorage.nbytes
_storage_resizable: Callable[[Any], bool] = torch.UntypedStorage.resizable

MAX_TENSORS = 250_000
"""More resident tensors than any checkpoint shard holds (DeepSeek V3: ~92,000 in all); the hook's
worst case grows linearly with it (5.2 s at the limit on CI: ``benchmarks/hook_at_limits.py``)."""
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

    Invariant: every piece lies on ``device`` inside a non-empty storage viewed by no excluded
    tensor name, starts on a float32 boundary, and shares no byte with any other piece.
    """

    regions: tuple[WeightRegion, ...]
    window_bytes: int
    device: torch.device

    @property
    def name(self) -> str:
        return self.regions[0].name


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
    names: list[str], values: list[object], words: Wording
) -> tuple[list[torch.UntypedStorage | None], list[int]]:
    """Each tensor's storage (``None`` where it has no readable one) and its size in bytes."""
    # A subclass's __torch_function__ could answer untyped_storage() with memory only the
    # plugin would hold (a lazily built copy): with it disabled, the answer is the tensor's own.
    with torch._C.DisableTorchFunctionSubclass():
        try:
            # C-level iteration, one call per tensor: a 100,000-tensor checkpoint stays fast.
            found: list[torch.UntypedStorage | None] = list(map(_storage_of, values))
            return found, list(map(_storage_nbytes, found))
        except Exception:  # a tensor without a plain storage, or a wrapper subclass's storage
            found = []
        for name, value in zip(names, values, strict=True):
            if not isinstance(value, torch.Tensor):
                raise WeightsError(
                    f"resident tensor {name!r:.200} is a {type(value).__name__}, not a "
                    f"torch.Tensor; fix: {words.tensors} must map names to tensors"
                )
            try:
                found.append(_storage_of(value))
            except Exception:  # tensor subclasses without a plain storage are not readable
                found.append(None)
    found = [s if _readable(s) else None for s in found]
    return found, [0 if s is None else _storage_nbytes(s) for s in found]


@dataclass
class ResidentStorages:
    """Each resident tensor's name, storage (``None`` where unreadable) and value, by index."""

    names: list[str]
    storages: list[torch.UntypedStorage | None]
    tensors: list[object]
    # Per borrowed skip reason, the indices skipped for it (in order, once).
    skipped: dict[str, dict[int, None]] = field(
        default_factory=lambda: {"borrowed": {}, "file-mapped": {}}
    )


class _FileSpans:
    """The process's file mappings (``/proc/self/maps``), read when a borrowed CPU storage asks."""

    def __init__(self) -> None:
        self._spans: tuple[list[int], list[int]] | None = None

    def hold(self, address: int) -> bool:
        if self._spans is None:
            self._spans = self._read()
        starts, ends = self._spans
        at = bisect_right(starts, address) - 1
        return at >= 0 and address < ends[at]

    @staticmethod
    def _read() -> tuple[list[int], list[int]]:
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


def storages_of(
    tensors: Mapping[str, torch.Tensor], device: torch.device, words: Wording = HOST
) -> tuple[Storages, ResidentStorages]:
    """The decision's view of ``tensors`` (sizes, address ranges, skips), and their storages.

    A storage that does not own its memory (``resizable() == False``: a slice,
    ``from_blob``, DLPack, IPC) is skipped as ``"borrowed"`` (``"file-mapped"`` for a
    CPU file mapping): its owner could free or move the memory under the eviction.
    """
    names, values = _names_and_values(tensors, words)
    storages, sizes = _storages(names, values, words)
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
            mapped = storage.device.type == "cpu" and files.hold(_storage_pointer(storage))
            reason = "file-mapped" if mapped else "borrowed"
            held.skipped[reason][index] = None
            return reason
        found = storage.device
        if found not in verdicts:  # one dict lookup per call: it runs once per large storage
            if found.type == "meta":
                verdicts[found] = "meta"
            else:
                verdicts[found] = None if same_device(found, device) else "other device"
        return verdicts[found]

    def start(index: int) -> int:
        storage = storages[index]
        return 0 if storage is None else _storage_pointer(storage)

    # Columns asked only for the largest storages: all 100,000 of a checkpoint up front
    # would cost more than the choice.
    return Storages(names, sizes, _PerIndex(start), _PerIndex(skip)), held


def _names_and_values(
    tensors: Mapping[str, torch.Tensor], words: Wording
) -> tuple[list[str], list[object]]:
    """The mapping's names (plain ``str``) and values, bounded by :data:`MAX_TENSORS`."""
    names = _bounded_names(tensors, words)
    if not names:
        raise WeightsError(f"no resident checkpoint tensors; fix: {words.loaded}")
    if set(map(type, names)) != {str}:
        odd = next((n for n in names if not isinstance(n, str)), None)
        if odd is not None:
            raise WeightsError(
                f"resident tensor name {described_value(odd)} has type {type(odd).__name__}, "
                f"not str; fix: {words.tensors} must map names (str) to tensors"
            )
        # str subclasses of the host's: plain copies, so ordering and echoes are str's own.
        names = [str.__str__(name) for name in names]
    values: list[object] = list(islice(tensors.values(), len(names)))
    if len(values) != len(names):
        raise WeightsError(
            f"{words.tensors} gave fewer values than names; fix: use a plain mapping"
        )
    return names, values


def _bounded_names(tensors: Mapping[str, torch.Tensor], words: Wording) -> list[Any]:
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
                f"{words.tensors} holds more than {MAX_TENSORS:,} names; fix: {words.by_name}"
            )
        if chars > MAX_NAME_CHARS:
            raise WeightsError(
                f"the names of {words.tensors} hold more than {MAX_NAME_CHARS:,} characters "
                f"(after {len(found):,} names; a checkpoint's names are under 100 characters "
                f"each); fix: {words.by_name}"
            )
    return found


@dataclass(frozen=True)
class _PerIndex:
    """A column of :class:`~._decision.Storages` computed on demand, index by index."""

    read: Callable[[int], Any]

    def __getitem__(self, index: int, /) -> Any:
        return self.read(index)


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


def weight_choice(
    choice: RegionChoice, held: ResidentStorages, device: torch.device, words: Wording = HOST
) -> WeightChoice:
    """The decision's regions as torch storages to read."""
    regions = []
    for source in choice.regions:
        pieces = []
        for piece in source.pieces:
            storage, tensor = held.storages[piece.owner], held.tensors[piece.owner]
            assert storage is not None  # the decision reads only storages that exist
            host = tensor if isinstance(tensor, torch.Tensor) else None
            pieces.append(WeightPiece(storage, piece.offset, piece.nbytes, host))
        regions.append(WeightRegion(source.name, source.storage_bytes, tuple(pieces)))
    for why, indices in held.skipped.items():
        if indices:
            names = map(held.names.__getitem__, indices)
            line = borrowed_line(why, names, len(indices), words)
            say(log, logging.INFO, "flare_l2evict: %s", line)
    return WeightChoice(tuple(regions), choice.window_bytes, device)
