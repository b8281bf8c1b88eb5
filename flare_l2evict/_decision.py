"""The start-up choice, torch-free: which bytes the eviction reads (start-up's and ``plan``'s).

Chosen address ranges that overlap merge into one region whose bytes count once,
so a window of N bytes always displaces N distinct bytes of L2.
"""

from __future__ import annotations

import heapq
import logging
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, groupby, islice, repeat
from operator import ge, is_
from typing import Protocol, TypeVar

from ._credit import WORD
from ._globs import matching
from ._log import say
from ._report import HOST, Wording
from ._text import shown

log = logging.getLogger("flare_l2evict.decision")
_SHARES = "shares a storage with an excluded tensor"
SKIP_REASONS = (
    "other device",
    "meta",
    "no storage",
    "borrowed",
    "file-mapped",
    "empty or freed",
    "excluded",
    _SHARES,
    "misaligned",
)
"""Why a tensor's storage is not read, in the order the shortfall line names them."""

MAX_PIECES = 64
"""Separate reads one eviction may make: each is a kernel launch before every race sample,
and past this many they cost more than stock's one read of its own buffer."""

_T_co = TypeVar("_T_co", covariant=True)


class Column(Protocol[_T_co]):
    """Read-only, indexable by position: a list, or a column computed on demand."""

    def __getitem__(self, index: int, /) -> _T_co: ...


@dataclass(frozen=True)
class Storages:
    """What a caller knows of the resident tensors: one entry per tensor, in columns; ``starts``
    and ``skips`` (why a storage is never read, or ``None``) are asked only of the largest
    storages, so they may be computed on demand."""

    names: Sequence[str]
    sizes: list[int]
    starts: Column[int]
    skips: Column[str | None] | None = None


@dataclass(frozen=True)
class Piece:
    """Bytes the eviction reads from one storage: ``[offset, offset + nbytes)`` of it."""

    owner: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Region:
    """One region (chosen storages that overlap in memory, merged) the eviction reads."""

    name: str
    storage_bytes: int
    pieces: tuple[Piece, ...]

    @property
    def read_bytes(self) -> int:
        return sum(piece.nbytes for piece in self.pieces)


@dataclass(frozen=True)
class RegionChoice:
    """The regions to read, largest first, and what they cover.

    Invariants a caller relies on: every piece lies inside its owner's storage;
    no two pieces share a byte; ``shortfall`` is ``None`` exactly when
    ``read_bytes >= window_bytes`` (the window rounded down to whole words is
    read), else ``regions`` is empty and ``shortfall`` says why in one line.
    """

    window_bytes: int
    regions: tuple[Region, ...]
    read_bytes: int
    shortfall: str | None


@dataclass
class _OpenRegion:
    start: int
    end: int
    name: str
    largest: int
    pieces: list[Piece] = field(default_factory=list)

    @property
    def readable(self) -> int:
        return sum(piece.nbytes for piece in self.pieces)


class _Union:
    """The chosen storages' address ranges, merged into disjoint regions kept in address order.

    Buckets of at most ``2 * _LOAD`` regions keep an add near-linear in any order;
    a merge keeps the region with the most pieces, so overlaps cost O(n log n).
    """

    _LOAD = 512

    def __init__(self) -> None:
        self._firsts: list[int] = []  # the first region's start, per bucket
        self._starts: list[list[int]] = []
        self._buckets: list[list[_OpenRegion]] = []
        self.readable = 0

    @property
    def empty(self) -> bool:
        return not self._buckets

    def regions(self) -> list[_OpenRegion]:
        """Every region, in address order."""
        return [region for bucket in self._buckets for region in bucket]

    def add(self, owner: int, name: str, start: int, size: int) -> None:
        end = start + size
        b, at = self._locate(start)
        touching: list[_OpenRegion] = []
        last, stop = b, at
        while last < len(self._buckets):
            bucket = self._buckets[last]
            while stop < len(bucket) and bucket[stop].start < end:
                touching.append(bucket[stop])
                stop += 1
            if stop < len(bucket) or last + 1 == len(self._buckets):
                break
            last, stop = last + 1, 0
        merged = _OpenRegion(start, end, name, size)
        if touching:
            merged.pieces = max(touching, key=lambda r: len(r.pieces)).pieces
        # The bytes no chosen storage holds yet are this storage's to read.
        cursor = start
        for region in touching:
            if region.start > cursor:
                self._read(merged, owner, start, cursor, region.start)
            cursor = max(cursor, region.end)
            merged.start, merged.end = min(merged.start, region.start), max(merged.end, region.end)
            if region.pieces is not merged.pieces:
                merged.pieces.extend(region.pieces)
            if region.largest > merged.largest or (
                region.largest == merged.largest and region.name < merged.name
            ):
                merged.name, merged.largest = region.name, region.largest
        if cursor < end:
            self._read(merged, owner, start, cursor, end)
        self._replace(b, at, last, stop, merged)

    def _read(self, region: _OpenRegion, owner: int, start: int, begin: int, end: int) -> None:
        """The whole words of ``[begin, end)`` become a piece of ``region``, read from ``owner``."""
        begin, end = -(-begin // WORD) * WORD, end // WORD * WORD
        if end > begin:
            region.pieces.append(Piece(owner, begin - start, end - begin))
            self.readable += end - begin

    def _locate(self, start: int) -> tuple[int, int]:
        """Bucket and position of the first region that ends after ``start`` or starts past it."""
        if not self._buckets:
            return 0, 0
        b = max(0, bisect_right(self._firsts, start) - 1)
        at = bisect_right(self._starts[b], start)
        if at and self._buckets[b][at - 1].end > start:
            at -= 1
        return b, at

    def _replace(self, b: int, at: int, last: int, stop: int, merged: _OpenRegion) -> None:
        """Regions from ``(b, at)`` up to ``(last, stop)`` (exclusive) become ``merged``."""
        if not self._buckets:
            self._buckets, self._starts, self._firsts = [[merged]], [[merged.start]], [merged.start]
            return
        if last == b:
            self._buckets[b][at:stop] = [merged]
            self._starts[b][at:stop] = [merged.start]
        else:
            self._buckets[b][at:] = [merged]
            self._starts[b][at:] = [merged.start]
            del self._buckets[last][:stop], self._starts[last][:stop]
            gone = last + 1 if not self._buckets[last] else last  # buckets b+1..gone-1 vanish
            del self._buckets[b + 1 : gone], self._starts[b + 1 : gone], self._firsts[b + 1 : gone]
            if gone == last:  # what is left of bucket `last` now follows bucket b
                self._firsts[b + 1] = self._starts[b + 1][0]
        self._firsts[b] = self._starts[b][0]
        if len(self._buckets[b]) > 2 * self._LOAD:
            half = len(self._buckets[b]) // 2
            self._buckets[b + 1 : b + 1] = [self._buckets[b][half:]]
            self._starts[b + 1 : b + 1] = [self._starts[b][half:]]
            del self._buckets[b][half:], self._starts[b][half:]
            self._firsts[b + 1 : b + 1] = [self._starts[b + 1][0]]


class _Ranges:
    """Disjoint address ranges (the excluded storages), asked whether a range touches one."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for low, high in sorted(ranges):
            if merged and low < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], high)
            else:
                merged.append([low, high])
        self.lows = [low for low, _ in merged]
        self.highs = [high for _, high in merged]

    def touch(self, start: int, end: int) -> bool:
        at = bisect_right(self.highs, start)
        return at < len(self.lows) and self.lows[at] < end


def choose_regions(
    storages: Storages,
    window_bytes: int,
    exclude: Sequence[str] = (),
    *,
    where: str = "the device",
    words: Wording = HOST,
) -> RegionChoice:
    """The storages whose tail the eviction reads, largest first, until the window is covered.

    Skipped, empty and misaligned storages, and any overlapping an ``exclude`` match,
    are never read. Ties go to the name that sorts first (then the lower address),
    so the same tensors give the same choice in any order. DEBUG: :func:`_log_choice`.
    """
    if window_bytes <= 0:
        raise ValueError("window_bytes must be positive")
    sizes = storages.sizes
    named = matching(storages.names, exclude) if exclude else []
    excluded = _Ranges(_excluded_ranges(storages, named))
    window_words = window_bytes // WORD * WORD
    total = sum(sizes) if min(sizes, default=0) >= 0 else sum(s for s in sizes if s > 0)
    # Every byte together too few: no need to try each.
    union = _Gather(storages, excluded, window_bytes).union() if total >= window_words else None
    if union is None or union.readable < window_words:
        why = _shortfall(storages, window_bytes, _Excluded(excluded, set(named)), where, words)
        choice = RegionChoice(window_bytes, (), 0, why)
    elif (tails := _tails(union.regions(), storages.starts, window_words))[1] <= MAX_PIECES:
        choice = RegionChoice(
            window_bytes, tuple(tails[0]), sum(r.read_bytes for r in tails[0]), None
        )
    else:
        too_many = (
            f"the {window_bytes:,}-byte eviction window on {where} would be read in more than "
            f"{MAX_PIECES} separate pieces (the largest eligible storages are small), one "
            "launch each before every race sample: slower than stock's single read; stock "
            "b12x keeps its own buffer"
        )
        choice = RegionChoice(window_bytes, (), 0, too_many)
    if log.isEnabledFor(logging.DEBUG):
        _log_choice(storages, choice, excluded, where)
    return choice


class _Gather:
    """Eligible storages merged into regions, largest size first, until they cover the window.

    Invariant a caller relies on: :meth:`union` holds only storages that are not skipped,
    start on a float32 boundary and touch no excluded range, taken within one size by
    name, then address (the same tensors in any order give the same union).
    """

    def __init__(self, storages: Storages, excluded: _Ranges, window_bytes: int) -> None:
        self._storages = storages
        self._excluded = excluded
        self._window_bytes = window_bytes
        self._window_words = window_bytes // WORD * WORD
        self._union = _Union()
        self._counted: list[Counter[str]] = []

    def union(self) -> _Union:
        size_of = self._storages.sizes.__getitem__
        # A stable sort: each size's tensors come in index order, as given.
        by_size = sorted(range(len(self._storages.sizes)), key=size_of, reverse=True)
        for size, group in groupby(by_size, key=size_of):
            if size <= 0 or self._covered:
                break
            views = list(group)
            if not self._alone_covers(views, size):
                self._by_address(views, size)
        return self._union

    @property
    def _covered(self) -> bool:
        return self._union.readable >= self._window_words

    def _alone_covers(self, views: list[int], size: int) -> bool:
        # Fast path: the view whose name sorts first names its storage, and that
        # storage comes first among this size's; when it alone finishes the
        # window, the grouping would take exactly it. A C-level min over
        # 100,000 fused-block views beats asking each view for its address.
        names, skips = self._storages.names, self._storages.skips
        j = min(views, key=names.__getitem__)
        if not (
            self._union.empty
            and size >= self._window_bytes
            and (skips is None or skips[j] is None)
            # An equal name elsewhere (only a direct caller passes one) ties on the address.
            and self._unique_name(j)
        ):
            return False
        self._take(j, self._storages.starts[j], size)
        if self._covered:
            return True
        self._union = _Union()
        return False

    def _by_address(self, views: list[int], size: int) -> None:
        names, starts, skips = self._storages.names, self._storages.starts, self._storages.skips
        first: dict[int, int] = {}  # storage start -> index of its first name
        for j in views:
            if skips is not None and skips[j] is not None:
                continue
            start = starts[j]
            k = first.get(start)
            if k is None or names[j] < names[k]:
                first[start] = j
        for start, j in sorted(first.items(), key=lambda item: (names[item[1]], item[0])):
            self._take(j, start, size)
            if self._covered:
                return

    def _unique_name(self, j: int) -> bool:
        # One C-level count the first time (the usual single fast path); a hostile
        # host whose every large storage is skipped gets one Counter, not a count each.
        names = self._storages.names
        if not self._counted:
            self._counted.append(Counter())
            return names.count(names[j]) == 1
        if not self._counted[0]:
            self._counted[0] = Counter(names)
        return self._counted[0][names[j]] == 1

    def _take(self, j: int, start: int, size: int) -> None:
        # A float32 read of a storage that starts off a word boundary faults on a GPU.
        if start % WORD == 0 and not self._excluded.touch(start, start + size):
            self._union.add(j, self._storages.names[j], start, size)


def _tails(
    regions: list[_OpenRegion], starts: Column[int], window_words: int
) -> tuple[list[Region], int]:
    """Each region's tail, largest region first, until ``window_words`` bytes; the piece count."""
    chosen: list[Region] = []
    remaining = window_words
    pieces = 0
    for region in sorted(regions, key=lambda r: (-r.readable, r.name, r.start)):
        if remaining <= 0 or pieces > MAX_PIECES:
            break
        taken: list[Piece] = []
        ordered = (
            region.pieces
            if len(region.pieces) == 1
            else sorted(region.pieces, key=lambda p: starts[p.owner] + p.offset)
        )
        for piece in reversed(ordered):  # the region's end first: least likely to be warm
            if remaining <= 0:
                break
            count = min(piece.nbytes, remaining)
            taken.append(Piece(piece.owner, piece.offset + piece.nbytes - count, count))
            remaining -= count
        pieces += len(taken)
        chosen.append(Region(region.name, region.end - region.start, tuple(reversed(taken))))
    return chosen, pieces


def _excluded_ranges(storages: Storages, matched: Iterable[int]) -> list[tuple[int, int]]:
    """The address ranges of the storages that the tensors ``matched`` (by an ``exclude``
    glob) view."""
    skips = storages.skips
    return [
        (storages.starts[i], storages.starts[i] + storages.sizes[i])
        for i in matched
        if storages.sizes[i] > 0 and (skips is None or skips[i] is None)
    ]


@dataclass(frozen=True)
class _Excluded:
    """The excluded storages' ranges, and the tensors whose own names an ``exclude`` glob
    matched (the others in those storages are kept out only by sharing one)."""

    ranges: _Ranges
    named: set[int]


def _shortfall(
    storages: Storages, window_bytes: int, excluded: _Excluded, where: str, words: Wording
) -> str:
    """The one line saying why the eligible storages cannot cover the window."""
    counts = dict.fromkeys(SKIP_REASONS, 0)
    named: dict[str, list[str]] = {"borrowed": [], "file-mapped": []}
    skips, starts = storages.skips, storages.starts
    ranges: set[tuple[int, int]] = set()
    for i, size in enumerate(storages.sizes):
        reason = None if skips is None else skips[i]
        if reason is None and size <= 0:
            reason = "empty or freed"
        if reason is None:
            start = starts[i]
            if start % WORD:
                reason = "misaligned"
            elif i in excluded.named:
                reason = "excluded"
            elif excluded.ranges.touch(start, start + size):
                reason = _SHARES
            else:
                ranges.add((start, start + size))
        if reason is not None:
            counts[reason] += 1
            if reason in named and len(named[reason]) < _NAMED:
                named[reason].append(storages.names[i])
    distinct, reach = 0, 0  # one sweep: _Ranges' merged lists cost twice as much here
    for low, high in sorted(ranges):
        distinct += max(0, high - max(low, reach))
        reach = max(reach, high)
    skipped = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
    return (
        f"no storage on {where} covers the {window_bytes:,}-byte eviction window: "
        + (
            f"{len(ranges):,} eligible storages hold"
            if len(ranges) != 1
            else "1 eligible storage holds"
        )
        + f" {distinct:,} distinct bytes"
        + (f" (tensors skipped: {skipped})" if skipped else "")
        + "; stock b12x keeps its own buffer"
        + "".join(
            _borrowed_fix(why, names, counts[why], words) for why, names in named.items() if names
        )
    )


_NAMED = 3
"""Names one line shows of the tensors skipped as borrowed; the rest are counted."""

_BORROWED_WORDS = {  # skip reason -> what it is, and the fix
    "borrowed": (
        "a storage that does not own its memory: a slice base[a:b], from_blob, DLPack, IPC",
        "include a tensor over the owning storage in {tensors}, or allocate the weights with torch",
    ),
    "file-mapped": (
        "memory mapped from a file, an mmap: torch.load(mmap=True), safetensors on the CPU",
        "load the weights into memory torch allocates (torch.load without mmap=True, or "
        ".clone() the mapped tensors) before {began}",
    ),
}


def _named(names: Iterable[str], count: int) -> str:
    """The first :data:`_NAMED` of ``count`` names, the rest counted."""
    listed = ", ".join(shown(repr(name), 80) for name in islice(names, _NAMED))
    return listed + (f" and {count - _NAMED:,} more" if count > _NAMED else "")


def _borrowed_fix(why: str, names: list[str], count: int, words: Wording) -> str:
    what, fix = _BORROWED_WORDS[why]
    return f"; {why} ({what}): {_named(names, count)}; fix: {_fix(fix, words)}"


def _fix(fix: str, words: Wording) -> str:
    return fix.format(tensors=words.tensors, began=words.began)


def borrowed_line(why: str, names: Iterable[str], count: int, words: Wording = HOST) -> str:
    """One line naming (bounded) the ``count`` tensors skipped as ``why``, with the fix."""
    what, fix = _BORROWED_WORDS[why]
    are = f"{count:,} resident tensors are" if count != 1 else "1 resident tensor is"
    return (
        f"{are} not read because their storage borrows memory "
        f"({what}), which its owner can free, move or unmap under the eviction: "
        f"{_named(names, count)}; fix: {_fix(fix, words)}"
    )


_LISTED = 5
"""Storages a DEBUG line lists, largest first; the rest are counted."""


def _log_choice(storages: Storages, choice: RegionChoice, excluded: _Ranges, where: str) -> None:
    """Two DEBUG lines at any tensor count: the largest storages and what became of each (the
    rest counted; views of one share start and size); the skips per reason (three names each)
    and the outcome. A pass over every tensor, at C speed where it can be: DEBUG only."""
    names, sizes, everyone = storages.names, storages.sizes, range(len(storages.sizes))
    try:
        starts = list(map(storages.starts.__getitem__, everyone))
        skips = storages.skips
        why: list[str | None] = list(map(skips.__getitem__, everyone)) if skips else []
    except Exception as error:  # a description must never cost the choice it describes
        say(log, logging.DEBUG, "flare_l2evict: decision on %s not described (%r)", where, error)
        return
    why = why or [None] * len(sizes)
    for i in compress(everyone, map(is_, why, repeat(None))):
        size, start = sizes[i], starts[i]
        if size <= 0 or start % WORD or excluded.touch(start, start + size):
            why[i] = "empty or freed" if size <= 0 else "misaligned" if start % WORD else "excluded"
    keys = list(zip(starts, sizes, strict=True))
    distinct = dict.fromkeys(keys)
    cut = min(heapq.nlargest(_LISTED, (size for _, size in distinct)), default=0)
    first: dict[tuple[int, int], int] = {}  # the largest storages' names that sort first
    for i in compress(everyone, map(ge, sizes, repeat(cut))):
        if keys[i] not in first or names[i] < names[first[keys[i]]]:
            first[keys[i]] = i
    read: Counter[tuple[int, int]] = Counter()
    for piece in (piece for region in choice.regions for piece in region.pieces):
        read[keys[piece.owner]] += piece.nbytes
    top = heapq.nsmallest(_LISTED, first.items(), key=lambda kv: (-kv[0][1], names[kv[1]]))
    listed = "; ".join(
        f"{shown(repr(names[i]), 80)} {key[1]:,} B: "
        + (why[i] or (f"read {read[key]:,} B" if read[key] else "not read"))
        for key, i in top
    )
    counts = Counter(why)
    skipped = ", ".join(
        f"{counts[r]:,} {r} ({_named((names[i] for i in everyone if why[i] == r), counts[r])})"
        for r in SKIP_REASONS
        if counts[r]
    )
    # Its own clause: after a storage's "not read", " and N more" read as N more not read.
    rest = len(distinct) - len(top)
    more = f"; {rest:,} more storage{'s' * (rest != 1)} not listed" if rest > 0 else ""
    outcome = f"reads {choice.read_bytes:,} bytes" if choice.shortfall is None else "reads none"
    say(log, logging.DEBUG, "flare_l2evict: decision on %s: %s tensors in %s storages, largest "
        "first: %s%s", where, f"{len(names):,}", f"{len(distinct):,}", listed, more)  # fmt: skip
    say(log, logging.DEBUG, "flare_l2evict: decision on %s: skipped: %s; %s of the %s-byte "
        "window", where, skipped or "none", outcome, f"{choice.window_bytes:,}")  # fmt: skip
