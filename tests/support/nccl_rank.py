"""Rank body for the NCCL test: one process per GPU, the reference host on each.

Imported by spawned children (multiprocessing passes the parent's sys.path).
Each rank loads its own shard (a synthetic MoE checkpoint written per rank),
starts up without and with ``--plugin l2evict`` (real b12x race jobs on its
own GPU) and writes what it saw to ``rank{N}.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from flare_l2evict import hookimpl
from flare_l2evict.tools.reference_host import PROFILES, ReferenceHost, write_example_checkpoint
from support.figures import KV_BYTES_PER_TOKEN
from support.startups import eviction_of, installed


class StorageDeviceCheck:
    """A harness plugin that runs after l2evict and records where its eviction reads."""

    def __init__(self) -> None:
        self.devices: list[str] = []

    @hookimpl(trylast=True)
    def before_first_capture(self, runtime: object) -> None:
        startup = installed()
        if startup is not None:
            self.devices = sorted({str(v.device) for v in eviction_of(startup).views()})


def rank_main(rank: int, world_size: int, directory: str) -> None:
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{directory}/store", rank=rank, world_size=world_size,
        device_id=device,
    )  # fmt: skip
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    shard = write_example_checkpoint(Path(directory) / f"rank{rank}", max(2 * l2, 64 << 20))
    results = {}
    for name, plugins in (("stock", ()), ("plugin", ("l2evict",))):
        host = ReferenceHost(
            plugins=plugins, device=device, profile=PROFILES["h200"],
            kv_bytes_per_token=KV_BYTES_PER_TOKEN, rank=rank, world_size=world_size,
            process_group=dist.group.WORLD,
        )  # fmt: skip
        check = StorageDeviceCheck()
        host.pm.register(check, name="storage-device-check")
        result = host.start(shard)
        results[name] = {**result.model_dump(mode="json"), "eviction_devices": check.devices}
    Path(directory, f"rank{rank}.json").write_text(json.dumps(results, default=str))
    dist.barrier()
    dist.destroy_process_group()
