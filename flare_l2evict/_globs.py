"""``exclude``'s tensor-name globs: fnmatch's meaning, in time linear in the names' length.

fnmatch's regex lets each ``*`` retry every later position, so a name is read about
once per character of the glob: 8 globs of 4 ``*`` over 2,000 names of 8,000 characters
took 130 s in the hook. Here a glob is cut at its ``*``: the part before the first ``*``
must sit at the name's start and the part after the last at its end (each checked in
place), and each part between two ``*`` is searched for from where the previous one
ended. The leftmost find is always right (a later one only leaves less room for the
rest). Each step is one C-level pass over the names still in the running.

The search is ``str.find``. In a short text CPython restarts it after a partial match,
at the part's first character, so it reads a name at most once more per recurrence of
that character in the part: a part that repeats it more than :data:`_FIRST_REPEATS`
times is searched by ``str.find`` only :data:`_SHORT_COMPARES` deep into each name, and
further in all the names joined (:class:`_Joined`), where CPython's search is linear.

A ``?`` or ``[...]`` between two ``*`` would make the search retry every position:
:func:`wildcard_between_stars` names such globs, and the settings refuse them. Torch-free.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from operator import add, and_, lt, not_, sub

_WRAPPED = re.compile(r"\(\?s:(.*)\)\\[Zz]", re.DOTALL)


def _tokens(part: str) -> list[str]:
    """``part`` (no ``*`` outside a ``[...]``) as fnmatch reads it: one string per character
    matched (a literal character, ``?`` or a whole ``[...]``)."""
    tokens: list[str] = []
    i, n = 0, len(part)
    while i < n:
        if part[i] == "[":  # fnmatch's rule: "]" right after "[" or "[!" is a member
            j = i + 1
            if j < n and part[j] == "!":
                j += 1
            if j < n and part[j] == "]":
                j += 1
            close = part.find("]", j)
            if close >= 0:
                tokens.append(part[i : close + 1])
                i = close + 1
                continue
        tokens.append(part[i])
        i += 1
    return tokens


def _parts(glob: str) -> list[str]:
    """``glob`` cut at each ``*`` outside a ``[...]`` (``[*]`` is a literal star)."""
    parts: list[str] = []
    start, i, n = 0, 0, len(glob)
    while i < n:
        if glob[i] == "*":
            parts.append(glob[start:i])
            start = i + 1
        elif glob[i] == "[":
            j = i + 1
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            close = glob.find("]", j)
            if close >= 0:
                i = close
        i += 1
    parts.append(glob[start:])
    return parts


def _wild(token: str) -> bool:
    return token == "?" or (len(token) > 1 and token[0] == "[")


def wildcard_between_stars(glob: str) -> bool:
    """Whether ``glob`` has a ``?`` or ``[...]`` between two ``*`` (no linear search finds it)."""
    return any(_wild(token) for part in _parts(glob)[1:-1] for token in _tokens(part))


def _regex(part: str) -> str:
    """The regex of a ``*``-free part, as fnmatch writes it, unanchored."""
    wrapped = _WRAPPED.fullmatch(fnmatch.translate(part))
    if wrapped is None:  # pragma: no cover - a Python whose fnmatch writes another shape
        raise RuntimeError(f"fnmatch.translate wrote an unknown shape for {part!r}")
    return f"(?s:{wrapped.group(1)})"


_NOT_FOUND = (-1).__ne__
_MISSING = (-1).__eq__
_FIRST_REPEATS = 4
"""How often a part's first character may recur in it for ``str.find`` on any one name.
CPython's search in a short text restarts after each partial match, at the part's first
character, so it reads a name at most this often, plus once."""
_SHORT_COMPARES = 1024
"""Characters ``str.find`` may compare in one name (its worst case: every place the part
could start, times the part) for a part that repeats its first character more often: it
searches that far into each name, and what is left, in all the names joined
(:class:`_Joined`), which reads each character once but costs a Python step per name."""
_PADDING = 30_000
"""Characters after the joined names, so that ``str.find`` always searches a long text
and takes CPython's linear (two-way) search, never the restarting one."""
_ATOMIC = sys.version_info >= (3, 11)  # (?>...): a tail checked in place by the same pattern


def _kept(
    found: Sequence[int], names: Sequence[str], keep: Sequence[object]
) -> tuple[list[int], list[str]]:
    return list(compress(found, keep)), list(compress(names, keep))


class _Joined:
    """All the names in one text: one search finds a part's leftmost occurrence for every
    name up to it, and the searches never read a character twice."""

    def __init__(self, names: Sequence[str], parts: Iterable[str]) -> None:
        used = set("".join(parts))
        pad = next(chr(code) for code in range(len(used) + 1) if chr(code) not in used)
        self.text = "".join(names) + pad * _PADDING
        self.bounds = [0, *accumulate(map(len, names))]

    def where(
        self, part: str, found: Iterable[int], starts: Iterable[int], limits: Iterable[int]
    ) -> list[int]:
        """Per name (indices ``found``, ascending), where ``part`` first lies inside
        ``[start, limit)`` of it, or -1. One search per name the part is found in (or
        ends past), none for the names between: a rare part costs one reading of the text."""
        size, find = len(part), self.text.find
        bases = list(map(self.bounds.__getitem__, found))
        lows, highs = list(map(add, bases, starts)), list(map(add, bases, limits))
        where = [-1] * len(lows)
        i = 0
        while i < len(lows):
            if highs[i] - lows[i] < size:  # no room: no search (its setup reads the part)
                i += 1
                continue
            at = find(part, lows[i])  # after the last one found: the scans never overlap
            if at < 0:
                break
            # The names before the one `at` lies in end before it: none holds the part.
            j = bisect_right(lows, at, i) - 1
            if at <= highs[j] - size:
                where[j] = at - bases[j]
            i = j + 1
        return where


@dataclass(frozen=True)
class _Part:
    """One part between two ``*``: literal text found by ``str.find`` (on each name, or in
    all the names joined), or a pattern (``?`` or ``[...]``, which the settings refuse)."""

    text: str
    size: int  # characters it matches
    pattern: re.Pattern[str] | None
    reach: int | None  # window str.find searches alone, the rest joined (None: all alone)

    @classmethod
    def of(cls, part: str, tokens: list[str]) -> _Part:
        if any(map(_wild, tokens)):
            return cls(part, len(tokens), re.compile(_regex(part)), None)
        if len(part) < 6 or part.count(part[0], 1, len(part) - 1) <= _FIRST_REPEATS:
            return cls(part, len(part), None, None)
        return cls(part, len(part), None, len(part) - 1 + _SHORT_COMPARES // (len(part) - 1))

    def where(
        self,
        names: list[str],
        found: list[int],
        starts: list[int],
        limits: list[int],
        joined: Callable[[], _Joined],
    ) -> list[int]:
        """Per name, where the part first lies inside ``[start, limit)`` of it, or -1."""
        if self.pattern is not None:
            hits = map(self.pattern.search, names, starts, limits)
            return [-1 if hit is None else hit.start() for hit in hits]
        return self._where(names, found, starts, limits, joined)

    def _where(
        self,
        names: list[str],
        found: list[int],
        starts: list[int],
        limits: list[int],
        joined: Callable[[], _Joined],
    ) -> list[int]:
        text, reach = self.text, self.reach
        if reach is None or max(limits, default=0) - min(starts, default=0) <= reach:
            return list(map(str.find, names, repeat(text), starts, limits))
        # First the first `reach` characters of each window, where str.find is cheap; then
        # the rest of the windows still without it, in the joined names.
        near = list(map(min, limits, map(add, starts, repeat(reach))))
        first = list(map(str.find, names, repeat(text), starts, near))
        if -1 not in first:
            return first
        further = list(map(and_, map(_MISSING, first), map(lt, near, limits)))
        if not any(further):
            return first
        # An occurrence may begin before `near` and end after it.
        resumed = map(sub, compress(near, further), repeat(self.size - 1))
        together = joined().where(
            text, compress(found, further), resumed, compress(limits, further)
        )
        sources = (compress(first, map(not_, further)), iter(together))  # by `further`
        return list(map(next, map(sources.__getitem__, further)))


@dataclass(frozen=True)
class _Glob:
    """One glob, compiled: its head and tail checked in place, its middle parts searched.

    Each step is one C-level pass over the names still in the running (a part searched in
    the joined names costs a Python step per name it is found in).
    """

    whole: re.Pattern[str] | None  # a glob without '*': one fixed-width match
    head: str  # literal text (startswith); "" when ``ends`` checks it
    ends: re.Pattern[str] | None  # a head or tail of '?' or '[...]', checked in place
    head_width: int
    middles: tuple[_Part, ...]
    tail: str  # literal text (endswith); "" when ``ends`` or ``tail_pattern`` checks it
    tail_pattern: re.Pattern[str] | None  # a '?' or '[...]' tail ``ends`` cannot check
    tail_width: int

    @classmethod
    def of(cls, glob: str) -> _Glob:
        parts = _parts(glob)
        if len(parts) == 1:
            return cls(re.compile(fnmatch.translate(glob)), "", None, 0, (), "", None, 0)
        tokens = [_tokens(part) for part in parts]
        middles = tuple(_Part.of(p, t) for p, t in zip(parts[1:-1], tokens[1:-1], strict=True) if p)
        head, tail, head_width, tail_width = parts[0], parts[-1], len(tokens[0]), len(tokens[-1])
        wild_head, wild_tail = any(map(_wild, tokens[0])), any(map(_wild, tokens[-1]))
        if not (wild_head or wild_tail):
            return cls(None, head, None, head_width, middles, tail, None, tail_width)
        # One pattern, one match per name: the head in place, room for the rest (a count of
        # any character jumps), and on 3.11 the tail in place at the end (an atomic jump).
        rest = sum(map(len, tokens[1:]))
        pattern = (_regex(head) if wild_head else re.escape(head)) + f"(?=(?s:.){{{rest}}})"
        tail_pattern = None
        if wild_tail and _ATOMIC:
            pattern += f"(?>(?s:.*))(?<={_regex(tail)})"
        elif wild_tail:
            tail_pattern = re.compile(f"{_regex(tail)}\\Z")
        kept_tail = "" if wild_tail else tail
        return cls(
            None, "", re.compile(pattern), head_width, middles, kept_tail, tail_pattern, tail_width
        )

    def matching(self, names: Sequence[str], joined: Callable[[], _Joined]) -> list[int]:
        """The indices of the names this glob matches, in order."""
        found: Sequence[int] = range(len(names))
        if self.whole is not None:
            return list(compress(found, map(self.whole.match, names)))
        width = self.tail_width
        if self.ends is not None:
            found, names = _kept(found, names, list(map(self.ends.match, names)))
        if self.head:
            found, names = _kept(found, names, list(map(str.startswith, names, repeat(self.head))))
        if self.tail:
            found, names = _kept(found, names, list(map(str.endswith, names, repeat(self.tail))))
        if self.tail_pattern is not None:
            at = map(sub, map(len, names), repeat(width))
            found, names = _kept(found, names, list(map(self.tail_pattern.match, names, at)))
        if not self.middles:
            if not (self.head_width and width) or self.ends is not None:
                return list(found)
            # Head and tail may not share a character ("ab*b" is not "ab").
            least = self.head_width + width
            return list(compress(found, map(least.__le__, map(len, names))))
        found, names = list(found), list(names)
        starts = [self.head_width] * len(found)
        limits = list(map(len, names))
        if width:
            limits = list(map(sub, limits, repeat(width)))
        for number, middle in enumerate(self.middles, 1):
            # Leftmost, and inside [start, limit): the tail's characters stay the tail's.
            where = middle.where(names, found, starts, limits, joined)
            if number == len(self.middles):
                return list(compress(found, map(_NOT_FOUND, where)))
            if -1 in where:  # one C-level scan; the passes below only when a name drops out
                keep = list(map(_NOT_FOUND, where))
                found, names = _kept(found, names, keep)
                limits, where = list(compress(limits, keep)), list(compress(where, keep))
            starts = list(map(add, where, repeat(middle.size)))
        return found


def matching(names: Sequence[str], globs: Sequence[str]) -> list[int]:
    """The indices of the names any of ``globs`` matches (as :func:`fnmatch.fnmatchcase`),
    ascending.

    Linear in the names' characters for every glob :func:`wildcard_between_stars` passes.
    """
    compiled = [_Glob.of(glob) for glob in dict.fromkeys(globs)]
    made: list[_Joined] = []

    def joined() -> _Joined:  # built once, and only for a part that needs it
        if not made:
            parts = (
                part.text for glob in compiled for part in glob.middles if part.reach is not None
            )
            made.append(_Joined(names, parts))
        return made[0]

    hit = bytearray(len(names))
    for glob in compiled:
        for index in glob.matching(names, joined):
            hit[index] = 1
    return list(compress(range(len(names)), hit))
