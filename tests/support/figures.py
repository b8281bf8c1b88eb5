"""Figures the tests expect, derived from the package's own constants (never retyped)."""

from __future__ import annotations

from flare_l2evict._credit import CREDIT_OVERHEAD_BYTES as OWN, EVICTION_OUTPUT_BYTES as OUTPUTS
from flare_l2evict.tools._profiles import GiB, MiB
from flare_l2evict.tools.reference_host import DEFAULT_KV_BYTES_PER_TOKEN as KV_BYTES_PER_TOKEN

# OUTPUTS: what the eviction holds in torch's allocator (its outputs).
# OWN: what the credit subtracts once per process (outputs + the read kernel's code).
__all__ = ["KV_BYTES_PER_TOKEN", "OUTPUTS", "OWN", "GiB", "MiB"]
