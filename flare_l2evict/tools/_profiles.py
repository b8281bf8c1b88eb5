"""Named devices the reference host can stand in for on a CPU; torch-free, for the CLI."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class DeviceProfile:
    """Device memory, L2 size and race-job count of a deployment, for CPU runs.

    On a CUDA device the reference host reads memory and L2 from the device
    and takes only ``race_jobs`` from the profile.
    """

    name: str
    memory_bytes: int
    l2_cache_bytes: int
    race_jobs: int
    note: str


PROFILES: dict[str, DeviceProfile] = {
    "gb202": DeviceProfile(
        "gb202", 96 * GiB, 128 * MiB, 5, "RTX PRO 6000 Blackwell, the seed's TP4 deployment"
    ),
    "h100": DeviceProfile("h100", 80 * GiB, 50 * MiB, 5, "H100 80GB HBM3"),
    "h200": DeviceProfile("h200", 143_771 * MiB, 60 * MiB, 5, "H200 141GB HBM3e"),
}

DEFAULT_PROFILE = "gb202"
DEFAULT_KV_BYTES_PER_TOKEN = 948
"""The seed deployment's ratio: 12.16 GiB of KV budget for 13,777,024 tokens."""
