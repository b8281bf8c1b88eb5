"""Choose the resident storage whose reads replace b12x's eviction buffer."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

import torch

from ._errors import SourceError

# Unbound C methods, mapped over whole lists at C speed; typed loosely for that use.
_storage_of: Callable[[Any], torch.UntypedStorage] = torch.Tensor.untyped_storage
_storage_nbytes: Callable[[Any], int] = torch.UntypedStorage.nbytes
_storage_pointer: Callable[[Any], int] = torch.UntypedStorage.data_ptr
_length: Callable[[Any], int] = len


@dataclass(frozen=True)
class SourceStorage:
    """One storage the eviction reads, named by the first of its tensors' names."""

    name: str
    storage: torch.UntypedStorage
    nbytes: int


@dataclass(frozen=True)
class SourceChoice:
    """The storages to read, largest first; together they cover ``window_bytes``.

    Invariant: every storage is on ``device``, non-empty, not meta, distinct,
    and viewed by no excluded tensor name.
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


def _matches(patterns: Sequence[str]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def _same_device(a: torch.device, b: torch.device) -> bool:
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
        # C-level iteration, one call per tensor: the whole choice has to stay
        # near 20 ms for a 100,000-tensor checkpoint.
        return list(map(_storage_of, values)), True
    except Exception:
        pass
    found: list[torch.UntypedStorage | None] = []
    for name, value in zip(names, values, strict=True):
        if not isinstance(value, torch.Tensor):
            raise SourceError(
                f"resident tensor {name!r} is a {type(value).__name__}, not a torch.Tensor; "
                "fix: the host's resident_tensors() must map names to tensors"
            )
        try:
            found.append(value.untyped_storage())
        except Exception:  # tensor subclasses without a plain storage are not readable
            found.append(None)
    return found, False


def choose_source(
    tensors: Mapping[str, torch.Tensor],
    device: torch.device | str,
    window_bytes: int,
    exclude: Sequence[str] = (),
) -> SourceChoice:
    """The largest storage resident on ``device``; several, largest first, if one is short.

    Tensors that view one allocation count once. Storages on other devices
    (host RAM, pinned or not), meta tensors, empty or freed storages, and any
    storage viewed by a tensor whose name matches an ``exclude`` glob are
    skipped. The same tensors give the same choice: ties go to the name that
    sorts first. Raises :class:`SourceError` with the reason when the eligible
    storages together are smaller than ``window_bytes``.
    """
    device = torch.device(device)
    if window_bytes <= 0:
        raise ValueError("window_bytes must be positive")
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
                f"resident tensor name {odd!r} has type {type(odd).__name__}, not str; "
                "fix: the host's resident_tensors() must map names (str) to tensors"
            )
    storages, complete = _storages(names, list(tensors.values()))
    if complete:
        sizes = list(map(_length, storages))  # len(UntypedStorage) is nbytes, and cheaper
    else:
        sizes = [0 if s is None else _storage_nbytes(s) for s in storages]

    excluded: set[int] = set()
    pattern = _matches(exclude)
    if pattern is not None:
        excluded = {
            storages[i].data_ptr()  # type: ignore[union-attr]
            for i, name in enumerate(names)
            if storages[i] is not None and pattern.match(name)
        }

    def eligible(i: int) -> bool:
        storage = storages[i]
        return (
            storage is not None
            and sizes[i] > 0
            and _same_device(storage.device, device)
            and storage.device.type != "meta"
            and storage.data_ptr() not in excluded
        )

    def identities(views: list[int]) -> list[Hashable]:
        return list(map(_storage_pointer, [storages[j] for j in views]))

    picked, total = largest_first(names, sizes, identities, eligible, window_bytes)
    if total < window_bytes:
        raise SourceError(_shortfall(names, storages, sizes, device, window_bytes, excluded))
    chosen = (SourceStorage(name, storages[i], sizes[i]) for i, name in picked)  # type: ignore[arg-type]
    return SourceChoice(tuple(chosen), window_bytes, device)


def largest_first(
    names: Sequence[str],
    sizes: list[int],
    identities: Callable[[list[int]], list[Hashable]],
    eligible: Callable[[int], bool],
    window_bytes: int,
) -> tuple[list[tuple[int, str]], int]:
    """Distinct eligible storages, largest first, until ``window_bytes`` is covered.

    ``sizes[i]`` is the size of the storage behind tensor ``i``;
    ``identities(indices)`` names those tensors' storages (equal values, one
    storage); ``eligible(i)`` says whether tensor ``i``'s storage may be read
    (a property of the storage, so any of its tensors answers). Each storage
    is named by the first of its tensors' names in sort order, and ties in
    size go to that name, so the same checkpoint gives the same answer.
    Returns ``(index, name)`` pairs and their total bytes, which is below the
    window only when every eligible storage was taken. Shared by the start-up
    choice and the offline plan, so the two agree.
    """
    picked: list[tuple[int, str]] = []
    seen: set[Hashable] = set()
    total = 0
    same_size = _SameSize(sizes)
    # Usually the first size covers the window and the loop ends there.
    for size in sorted(set(sizes), reverse=True):
        if size == 0 or total >= window_bytes:
            break
        views = same_size(size)
        # Fast path: the view whose name sorts first names its storage, and that
        # storage comes first among this size's; when it alone finishes the
        # window, the full grouping below would pick exactly it. A C-level min
        # over 100,000 fused-block views beats the grouping by ~25 ms.
        j = min(views, key=names.__getitem__)
        identity = identities([j])[0]
        if total + size >= window_bytes and identity not in seen and eligible(j):
            picked.append((j, names[j]))
            total += size
            break
        first: dict[Hashable, int] = {}  # storage -> index of its first name
        for j, identity in zip(views, identities(views), strict=True):
            k = first.get(identity)
            if k is None or names[j] < names[k]:
                first[identity] = j
        for identity, i in sorted(first.items(), key=lambda item: names[item[1]]):
            if identity in seen or not eligible(i):
                continue
            seen.add(identity)
            picked.append((i, names[i]))
            total += size
            if total >= window_bytes:
                break
    return picked, total


class _SameSize:
    """Indices of the tensors whose storage has a given size.

    Views of one storage report the same storage size, so every view of a
    candidate is among them. The first few sizes are found with C-level
    passes (``list.index`` for a few views, ``compress`` over ``size.__eq__``
    for many); past that one grouping pass serves the rest.
    """

    _SCANS = 8
    _FEW = 16

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.scans = 0
        self.groups: dict[int, list[int]] | None = None

    def __call__(self, size: int) -> list[int]:
        if self.groups is None and self.scans >= self._SCANS:
            self.groups = {}
            for i, value in enumerate(self.sizes):
                self.groups.setdefault(value, []).append(i)
        if self.groups is not None:
            return self.groups.get(size, [])
        self.scans += 1
        if self.sizes.count(size) > self._FEW:
            return list(compress(range(len(self.sizes)), map(size.__eq__, self.sizes)))
        found: list[int] = []
        index = self.sizes.index
        try:
            while True:
                found.append(index(size, found[-1] + 1 if found else 0))
        except ValueError:
            return found


def _shortfall(
    names: list[str],
    storages: list[torch.UntypedStorage | None],
    sizes: list[int],
    device: torch.device,
    window_bytes: int,
    excluded: set[int],
) -> str:
    counts = {"other device": 0, "meta": 0, "empty or freed": 0, "excluded": 0, "no storage": 0}
    usable: dict[int, int] = {}
    for storage, size in zip(storages, sizes, strict=True):
        if storage is None:
            counts["no storage"] += 1
        elif storage.device.type == "meta":
            counts["meta"] += 1
        elif not _same_device(storage.device, device):
            counts["other device"] += 1
        elif size == 0:
            counts["empty or freed"] += 1
        elif storage.data_ptr() in excluded:
            counts["excluded"] += 1
        else:
            usable[storage.data_ptr()] = size
    skipped = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
    return (
        f"no storage on {device} covers the {window_bytes:,}-byte eviction window: "
        f"{len(usable)} eligible storages hold {sum(usable.values()):,} bytes"
        + (f" (tensors skipped: {skipped})" if skipped else "")
        + "; stock b12x keeps its own buffer"
    )
