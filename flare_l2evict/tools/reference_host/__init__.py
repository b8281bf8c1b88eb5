"""A reference flare host for tests and demos: not a server.

It proves the host contract in :mod:`flare_l2evict.hookspecs` end to end:
entry-point loading filtered by ``--plugin``, a deployment config, a
safetensors checkpoint on a device, the start-up hooks, b12x race jobs, and a
KV allocator that sizes the cache from what the plugins report.
"""

from .._inputs import installed_plugins
from .._profiles import DEFAULT_KV_BYTES_PER_TOKEN, DEFAULT_PROFILE, PROFILES, DeviceProfile
from .._startup_arm import StartupArm
from ._checkpoint import load_checkpoint
from ._example import example_tensors, write_example_checkpoint, write_sparse_index
from ._host import (
    ReferenceHost,
    ReferenceKVAllocator,
    ReferenceRuntime,
    plugin_manager,
)
from ._races import RaceResult, cute_guard, gemm_candidates, run_race

__all__ = [
    "DEFAULT_KV_BYTES_PER_TOKEN",
    "DEFAULT_PROFILE",
    "PROFILES",
    "DeviceProfile",
    "RaceResult",
    "ReferenceHost",
    "ReferenceKVAllocator",
    "ReferenceRuntime",
    "StartupArm",
    "cute_guard",
    "example_tensors",
    "gemm_candidates",
    "installed_plugins",
    "load_checkpoint",
    "plugin_manager",
    "run_race",
    "write_example_checkpoint",
    "write_sparse_index",
]
