"""Choose the resident weights the eviction reads: torch storages in, :mod:`._decision` decides."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ._decision import Choice, Storages, choose
from ._errors import SourceError

# Unbound C methods, mapped over whole lists at C speed; typed loosely for that use.
_storage_of: Callable[[Any], torch.UntypedStorage] = torch.Tensor.untyped_storage
_storage_pointer: Callable[[Any], int] = torch.UntypedStorage.data_ptr
_length: Callable[[Any], int] = len


@dataclass(frozen=True)
class SourcePiece:
    """Bytes ``[offset, offset + nbytes)`` of ``storage`` that the eviction reads (whole words)."""

    storage: torch.UntypedStorage = field(repr=False)
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SourceStorage:
    """One region of device memory the eviction reads, named by its largest storage's tensor.

    ``nbytes`` counts the region's distinct bytes (storages that overlap in
    memory count once); ``pieces`` are what is read of it, disjoint.
    """

    name: str
    nbytes: int
    pieces: tuple[SourcePiece, ...]


@dataclass(frozen=True)
class SourceChoice:
    """The regions to read, largest first; together they cover ``window_bytes``.

    Invariant: every piece lies on ``device`` inside a non-empty storage viewed by
    no excluded tensor name, starts on a float32 boundary, and shares no byte
    with any other piece.
    """

    storages: tuple[SourceStorage, ...]
    window_bytes: int
    device: torch.device

    @property
    def name(self) -> str:
        return self.storages[0].name

    @property
    def total_bytes(self) -> int:
        return sum(source.nbytes for source in self.storages)

    @property
    def read_bytes(self) -> int:
        return sum(piece.nbytes for source in self.storages for piece in source.pieces)


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
    try:
        # C-level iteration, one call per tensor: a 100,000-tensor checkpoint stays fast.
        return list(map(_storage_of, values)), True
    except Exception:
        pass
    found: list[torch.UntypedStorage | None] = []
    for name, value in zip(names, values, strict=True):
        if not isinstance(value, torch.Tensor):
            raise SourceError(
                f"resident tensor {name!r:.200} is a {type(value).__name__}, not a torch.Tensor; "
                "fix: the host's resident_tensors() must map names to tensors"
            )
        try:
            found.append(value.untyped_storage())
        except Exception:  # tensor subclasses without a plain storage are not readable
            found.append(None)
    return found, False


class _PerStorage:
    """A column of :class:`~._decision.Storages` computed on demand, storage by storage.

    The decision asks for addresses and devices only of the largest storages;
    asking all 100,000 of a checkpoint up front would cost more than the choice.
    """

    def __init__(
        self, storages: list[torch.UntypedStorage | None], read: Callable[[Any], Any]
    ) -> None:
        self._storages = storages
        self._read = read

    def __len__(self) -> int:
        return len(self._storages)

    def __getitem__(self, index: int, /) -> Any:
        return self._read(self._storages[index])


def storages_of(
    tensors: Mapping[str, torch.Tensor], device: torch.device
) -> tuple[Storages, list[torch.UntypedStorage | None]]:
    """The decision's view of ``tensors`` (sizes, address ranges, skips), and their storages."""
    names = list(tensors)
    if not names:
        raise SourceError(
            "no resident checkpoint tensors; fix: the host must call before_first_capture "
            "after the checkpoint is loaded onto the device"
        )
    if set(map(type, names)) != {str}:
        odd = next((n for n in names if not isinstance(n, str)), None)
        if odd is not None:
            raise SourceError(
                f"resident tensor name {odd!r:.200} has type {type(odd).__name__}, not str; "
                "fix: the host's resident_tensors() must map names (str) to tensors"
            )
    storages, complete = _storages(names, list(tensors.values()))
    if complete:
        sizes = list(map(_length, storages))  # len(UntypedStorage) is nbytes, and cheaper
    else:
        sizes = [0 if s is None else len(s) for s in storages]
    verdicts: dict[torch.device, str | None] = {}

    def skip(storage: torch.UntypedStorage | None) -> str | None:
        if storage is None:
            return "no storage"
        found = storage.device
        if found not in verdicts:
            if found.type == "meta":
                verdicts[found] = "meta"
            else:
                verdicts[found] = None if same_device(found, device) else "other device"
        return verdicts[found]

    starts = _PerStorage(storages, _storage_pointer)
    return Storages(names, sizes, starts, _PerStorage(storages, skip)), storages


def source_choice(
    choice: Choice, storages: Sequence[torch.UntypedStorage | None], device: torch.device
) -> SourceChoice:
    """The decision's regions as torch storages to read."""
    regions = []
    for source in choice.sources:
        pieces = []
        for piece in source.pieces:
            storage = storages[piece.owner]
            assert storage is not None  # the decision reads only storages that exist
            pieces.append(SourcePiece(storage, piece.offset, piece.nbytes))
        regions.append(SourceStorage(source.name, source.storage_bytes, tuple(pieces)))
    return SourceChoice(tuple(regions), choice.window_bytes, device)


def choose_source(
    tensors: Mapping[str, torch.Tensor],
    device: torch.device | str,
    window_bytes: int,
    exclude: Sequence[str] = (),
) -> SourceChoice:
    """The largest region of memory resident on ``device``; several, largest first, if one is short.

    Storages are counted by address range: tensors that view one allocation, and
    storage objects that overlap in memory, count once. Storages on other devices
    (host RAM, pinned or not), meta tensors, empty or freed storages, and any
    region touched by a tensor whose name matches an ``exclude`` glob are skipped.
    The same tensors give the same choice: ties go to the name that sorts first.
    Raises :class:`SourceError` with the reason when the eligible bytes together
    are fewer than ``window_bytes``.
    """
    device = torch.device(device)
    found, storages = storages_of(tensors, device)
    choice = choose(found, window_bytes, exclude, where=str(device))
    if choice.shortfall is not None:
        raise SourceError(choice.shortfall)
    return source_choice(choice, storages, device)
