"""Echo untrusted text safely: one line, bounded, with control characters escaped (torch-free)."""

from __future__ import annotations

import unicodedata

LIMIT = 200
"""Characters of any echoed value (a config value, a tensor name, a path) shown at most."""

_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp"})  # controls, format (bidi), line/paragraph breaks


def _escaped(char: str) -> str:
    if unicodedata.category(char) not in _UNSAFE:
        return char
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def shown(value: object, limit: int = LIMIT) -> str:
    """``str(value)`` on one line: control and bidi characters escaped, cut to ``limit`` chars."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > 4 * limit:  # escape no more than can be shown
        text = text[: 4 * limit]
        cut = True
    else:
        cut = False
    out = "".join(map(_escaped, text))
    if cut or len(out) > limit:
        return out[: limit - 1] + "…"
    return out
