"""Figures the tests expect, derived from the package's own constants (never retyped)."""

from __future__ import annotations

from flare_l2evict import EVICTION_OWN_BYTES as OWN
from flare_l2evict._units import GiB, MiB
from flare_l2evict.tools.reference_host import DEFAULT_KV_BYTES_PER_TOKEN as KV_BYTES_PER_TOKEN

__all__ = ["KV_BYTES_PER_TOKEN", "OWN", "GiB", "MiB"]
