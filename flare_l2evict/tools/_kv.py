"""KV tokens from bytes: the one rounding rule every figure the tools print goes through."""

from __future__ import annotations


def kv_tokens(nbytes: int, bytes_per_token: int) -> int:
    """Whole tokens that ``nbytes`` of KV cache hold: ``floor(nbytes / bytes_per_token)``.

    A token needs all of its bytes, so a part of one never counts; a negative
    byte count holds none. ``plan``'s "KV tokens gained" is this of the
    credit, and the reference host's KV cache is this of its own budget plus
    this of the credit, so the two always agree on what the credit adds.
    """
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token = {bytes_per_token}: must be positive")
    return max(0, nbytes) // bytes_per_token
