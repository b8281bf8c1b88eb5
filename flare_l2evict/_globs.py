"""``exclude``'s tensor-name globs: fnmatch's meaning, in time linear in the names' length.

fnmatch's regex lets each ``*`` retry every later position, so a name is read about
once per character of the glob: 8 globs of 4 ``*`` over 250,000 long names took about
40 s. Here a glob is cut at its ``*``: the part before the first ``*`` must sit at the
name's start and the part after the last at its end (each checked in place), and each
part between two ``*`` is searched for from where the previous one ended. The leftmost
find is always right (a later one only leaves less room for the rest), and a literal
part is found by sre's prefix search, which never reads a character twice (KMP).

A ``?`` or ``[...]`` between two ``*`` would make that search retry every position;
:func:`wildcard_between_stars` names such globs so that the settings refuse them.
Torch-free.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import sub

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


_END: Callable[[re.Match[str]], int] = re.Match.end


@dataclass(frozen=True)
class _Glob:
    """One glob, compiled: its head and tail checked in place, its middle parts searched."""

    whole: re.Pattern[str] | None  # a glob without '*': one fixed-width match
    head: str | re.Pattern[str]  # literal text (startswith) or a fixed-width pattern
    head_width: int
    middles: tuple[re.Pattern[str], ...]
    tail: str | re.Pattern[str]
    tail_width: int
    least: int  # the shortest name it can match

    @classmethod
    def of(cls, glob: str) -> _Glob:
        parts = _parts(glob)
        if len(parts) == 1:
            whole = re.compile(fnmatch.translate(glob))
            return cls(whole, "", 0, (), "", 0, 0)
        tokens = [_tokens(part) for part in parts]
        head, tail = (
            part if not any(map(_wild, found)) else re.compile(_regex(part))
            for part, found in ((parts[0], tokens[0]), (parts[-1], tokens[-1]))
        )
        middles = tuple(re.compile(_regex(part)) for part in parts[1:-1] if part)
        least = sum(map(len, tokens))
        return cls(None, head, len(tokens[0]), middles, tail, len(tokens[-1]), least)

    def matching(self, names: Sequence[str]) -> list[int]:
        """The indices of the names this glob matches, in order. C-level passes, one per part."""
        everyone = range(len(names))
        if self.whole is not None:
            return list(compress(everyone, map(self.whole.match, names)))
        found = list(compress(everyone, map(self.least.__le__, map(len, names))))
        subset = list(map(names.__getitem__, found))
        for check in self._in_place():
            keep = list(check(subset))
            found, subset = list(compress(found, keep)), list(compress(subset, keep))
        starts: Sequence[int] | repeat[int] = repeat(self.head_width)
        ends = list(map(sub, map(len, subset), repeat(self.tail_width)))
        for number, middle in enumerate(self.middles, 1):
            # Leftmost, and inside [start, end): the tail's characters stay the tail's.
            hits = list(map(middle.search, subset, starts, ends))
            found = list(compress(found, hits))
            if number == len(self.middles):
                break
            subset, ends = list(compress(subset, hits)), list(compress(ends, hits))
            starts = list(map(_END, filter(None, hits)))
        return found

    def _in_place(self) -> list[Callable[[list[str]], object]]:
        """The head's and tail's checks, each over a list of names at least ``least`` long."""
        checks: list[Callable[[list[str]], object]] = []
        head, tail, width = self.head, self.tail, self.tail_width
        if isinstance(head, str) and head:
            checks.append(lambda names: map(str.startswith, names, repeat(head)))
        elif isinstance(head, re.Pattern):
            checks.append(lambda names: map(head.match, names))
        if isinstance(tail, str) and tail:
            checks.append(lambda names: map(str.endswith, names, repeat(tail)))
        elif isinstance(tail, re.Pattern):
            end = re.compile(f"{tail.pattern}\\Z")
            checks.append(
                lambda names: map(end.match, names, map(sub, map(len, names), repeat(width)))
            )
        return checks


def matching(names: Sequence[str], globs: Sequence[str]) -> list[int]:
    """The indices of the names any of ``globs`` matches (as :func:`fnmatch.fnmatchcase`),
    ascending.

    Linear in the names' characters for every glob :func:`wildcard_between_stars` passes.
    """
    hit = bytearray(len(names))
    for glob in dict.fromkeys(globs):
        for index in _Glob.of(glob).matching(names):
            hit[index] = 1
    return list(compress(range(len(names)), hit))
