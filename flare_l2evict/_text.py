"""Echo untrusted values in messages and tables: bounded, on one line, nothing invisible.

A 10 MB value must not become a 10 MB line, and a newline, NUL or right-to-left
override must not break a line or disguise what follows. Torch-free.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Mapping

LIMIT = 200
"""Characters of one echoed value, the cut marker included."""

# Cc: C0/C1 controls (newline, NUL, ESC); Cf: format characters (the bidi overrides, isolates);
# Zl/Zp: line and paragraph separators; Cs: lone surrogates, which undecodable file names carry
# and no UTF-8 terminal can print.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _escaped(char: str) -> str:
    # No hidden character is printable, so repr escapes each: \n, \xhh, \uhhhh or \Uhhhhhhhh.
    return repr(char)[1:-1] if unicodedata.category(char) in _HIDDEN else char


def _cut(text: str, limit: int, *, complete: bool = True, total: int | None = None) -> str:
    """``text`` with hidden characters escaped, at most ``limit`` characters long.

    Only the prefix that fits is looked at. A cut value ends with ``...[N chars]``
    (``...`` when ``complete=False``: ``text`` is already a prefix).
    """
    limit = max(limit, 16)
    pieces: list[str] = []
    used = 0
    for char in text:
        piece = _escaped(char)
        if used + len(piece) > limit:
            break
        pieces.append(piece)
        used += len(piece)
    else:  # every character fitted
        if complete:
            return "".join(pieces)
    marker = "..." if total is None else f"...[{total:,} chars]"
    while pieces and used + len(marker) > limit:
        used -= len(pieces.pop())
    return "".join(pieces) + marker


def literal(value: object, limit: int = LIMIT) -> str:
    """``value`` as a one-line JSON-like literal, rendered only within ``limit``, 4 levels deep."""
    budget = max(limit, 16)
    out: list[str] = []
    size = 0

    def emit(text: str) -> bool:
        nonlocal size
        out.append(text)
        size += len(text)
        return size <= budget

    def render(item: object, depth: int) -> bool:
        if isinstance(item, str):
            return emit(json.dumps(item[:budget], ensure_ascii=False))
        if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > 64:
            # str() of a huge int is refused past 4,300 digits and slow before that.
            return emit(f"<int of {item.bit_length():,} bits>")
        if item is None or isinstance(item, bool | int | float):
            return emit(json.dumps(item))
        # Only containers whose iteration is the builtins' own: a host's may block or lie.
        builtin = type(item) in (list, tuple) or getattr(type(item), "items", None) is dict.items
        if builtin and isinstance(item, Mapping | list | tuple):
            opened, closed = ("{", "}") if isinstance(item, Mapping) else ("[", "]")
            if depth >= 4:
                return emit(f"{opened}...{closed}")
            if not emit(opened):
                return False
            entries = item.items() if isinstance(item, Mapping) else ((None, v) for v in item)
            for number, (key, entry) in enumerate(entries):
                if number and not emit(", "):
                    return False
                if isinstance(item, Mapping) and not (render(key, depth + 1) and emit(": ")):
                    return False
                if not render(entry, depth + 1):
                    return False
            return emit(closed)
        return emit(f"<{type(item).__name__}>")

    complete = render(value, 0)
    return _cut("".join(out), limit, complete=complete)


def shown(value: object, limit: int = LIMIT) -> str:
    """``value`` for a message or a table cell: at most ``limit`` characters, one line."""
    if isinstance(value, str):
        return _cut(value, limit, total=len(value))
    return literal(value, limit)


def described(error: BaseException, limit: int = LIMIT) -> str:
    """``Type: message`` of an exception on one bounded line, even when its ``__str__`` raises."""
    try:  # a metaclass of the host's may make even __name__ raise
        kind = str.__str__(type.__dict__["__name__"].__get__(type(error)))
    except Exception:
        kind = "an exception"
    try:
        text = str(error)  # a __str__ returning no str raises TypeError here
        text = str.__str__(text)  # a str subclass returned: its own methods are not called
    except Exception:
        text = "<its message could not be read>"
    return shown(" ".join(f"{kind}: {text}".split()), limit)


def described_value(value: object, limit: int = LIMIT) -> str:
    """``repr(value)`` on one bounded line, in time bounded by ``limit``, whatever the value.

    Only values whose repr is bounded are repr'd (numbers, ``None``, strings, torch
    devices and dtypes; plain containers as :func:`literal`; a tensor as shape and
    dtype); anything else is named by ``type()``, never ``__class__``. Never raises.
    """
    try:
        return _bounded_repr(value, limit)
    except Exception:
        return f"<a {type(value).__name__} whose repr raised>"


_REPR_BOUNDED = (bool, int, float, complex, type(None))


def _bounded_repr(value: object, limit: int) -> str:
    kind = type(value)
    if issubclass(kind, str):
        plain = str.__str__(value)
        text = repr(plain[: limit + 1])
        return _cut(text, limit, total=len(plain)) if len(plain) > limit else _cut(text, limit)
    if kind is int and value.bit_length() > 64:  # type: ignore[attr-defined]
        return f"<int of {value.bit_length():,} bits>"  # type: ignore[attr-defined]
    torch = sys.modules.get("torch")
    if kind in _REPR_BOUNDED or (torch is not None and kind in (torch.device, torch.dtype)):
        return shown(repr(value), limit)
    if torch is not None and issubclass(kind, torch.Tensor):
        shape = tuple(torch.Tensor.size(value))
        dtype = torch.Tensor.dtype.__get__(value)
        return f"<a {kind.__name__} of shape {shape} ({dtype})>"
    if kind in (dict, list, tuple):
        return literal(value, limit)
    return f"<a {kind.__name__}>"
