"""The CLI's error line: one printable line of bounded bytes, whatever an error carries."""

from __future__ import annotations

from .._text import _cut

LINE_BYTES = 1024
"""UTF-8 bytes of one error line the CLI prints, its newline included."""


def one_line(message: str, max_bytes: int = LINE_BYTES) -> str:
    """``message`` as one printable line of at most ``max_bytes`` UTF-8 bytes, newline included.

    The CLI's last guard: whatever an error carries, stderr gets one bounded line.
    """
    line = _cut(message, max_bytes)
    encoded = line.encode("utf-8")
    if len(encoded) < max_bytes:
        return line
    marker = "...[cut]"
    return encoded[: max_bytes - 1 - len(marker)].decode("utf-8", "ignore") + marker
