"""The one wrapping rule for what every command prints: lines break at blanks only.

A path, a name or a number an operator copies stays whole. ``textwrap``'s default cuts a
word longer than the width in two (a config path printed as ``.../deploy.t`` then ``oml``
cannot be pasted back); here such a word gets a line of its own, past the width. A value
that itself holds blanks (a path with a space in it) is kept whole by naming it in
``whole``. The width is fixed, not the terminal's: the outputs shown in the docs are the
same on every machine, and a terminal narrower than it folds a long line without cutting it.
Torch-free.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

WIDTH = 100
"""Columns every line a command prints fits in, but for a word longer than that."""

_JOINED = "\x00"
"""Stands for a blank inside a whole value while it is wrapped: echoed values never hold a
raw NUL (:func:`flare_l2evict._text.shown` escapes it), so it cannot be confused."""


def wrap(
    text: str,
    width: int = WIDTH,
    *,
    first: str = "",
    rest: str = "",
    whole: Iterable[str] = (),
) -> list[str]:
    """``text`` as lines of at most ``width`` columns, broken at blanks only.

    ``first`` begins the first line, ``rest`` every other; a word longer than the width is a
    line of its own. Each of ``whole`` found in ``text`` is never broken, even at its blanks.
    """
    joined = _JOINED not in text
    if joined:
        for value in whole:
            if " " in value:
                text = text.replace(value, value.replace(" ", _JOINED))
    lines = textwrap.wrap(
        text,
        width,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(_JOINED, " ") for line in lines] if joined else lines
