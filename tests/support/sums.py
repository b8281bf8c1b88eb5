"""Sums over a weight choice and an eviction's outputs that only the tests ask for."""

from __future__ import annotations

from flare_l2evict._eviction import WeightEviction
from flare_l2evict._weights import WeightChoice


def total_bytes(choice: WeightChoice) -> int:
    """The bytes of the chosen regions' storages, all regions together."""
    return sum(region.nbytes for region in choice.regions)


def read_bytes(choice: WeightChoice) -> int:
    """The bytes the chosen pieces read, all regions together."""
    return sum(piece.nbytes for region in choice.regions for piece in region.pieces)


def checksum(eviction: WeightEviction) -> float:
    """The sum of the eviction's last call's outputs (synchronises)."""
    return float(eviction._partial.sum().item() + eviction._out.item())
