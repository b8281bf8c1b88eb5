"""Tensor parallel on real GPUs over NCCL: one process per GPU, the reference host on each.

Each rank loads its own shard (a synthetic MoE checkpoint written per rank),
runs start-up without and with ``--plugin l2evict`` (real b12x race jobs on
its own GPU), and checks: one agreed figure on every rank, a measured saving
of at least that figure, the same race winners, and the chosen storage on the
rank's own device. Prints a per-rank table last; exits non-zero on a failed check.

    NCCL_NVLS_ENABLE=0 python benchmarks/tp_nccl.py [--world-size N]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flare_l2evict
from flare_l2evict import hookimpl
from flare_l2evict.tools.reference_host import PROFILES, ReferenceHost, write_example_checkpoint


class StorageDeviceCheck:
    """A harness plugin that runs after l2evict and records where its eviction reads."""

    def __init__(self) -> None:
        self.devices: list[str] = []

    @hookimpl(trylast=True)
    def before_first_capture(self, runtime: object) -> None:
        installation = flare_l2evict.active_installation()
        if installation is not None:
            self.devices = sorted({str(v.device) for v in installation.views()})


def rank_main(rank: int, world_size: int, directory: str) -> None:
    os.environ["NCCL_NVLS_ENABLE"] = "0"
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
            plugins=plugins, device=device, profile=PROFILES["h200"], kv_bytes_per_token=948,
            rank=rank, world_size=world_size, process_group=dist.group.WORLD,
        )  # fmt: skip
        check = StorageDeviceCheck()
        host.pm.register(check, name="storage-device-check")
        result = host.start(shard)
        results[name] = {**result.as_dict(), "eviction_devices": check.devices}
    Path(directory, f"rank{rank}.json").write_text(json.dumps(results, default=str))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    world_size = torch.cuda.device_count()
    if "--world-size" in sys.argv:
        world_size = int(sys.argv[sys.argv.index("--world-size") + 1])
    with tempfile.TemporaryDirectory() as directory:
        for rank in range(world_size):
            Path(directory, f"rank{rank}").mkdir()
        mp.start_processes(rank_main, args=(world_size, directory), nprocs=world_size,
                           start_method="spawn")  # fmt: skip
        ranks = [
            json.loads(Path(directory, f"rank{r}.json").read_text()) for r in range(world_size)
        ]
    agreed = {r["plugin"]["report"]["reclaimed_bytes"] for r in ranks}
    failures = []
    if len(agreed) != 1 or 0 in agreed:
        failures.append(f"agreed figures differ or are zero: {agreed}")
    print(f"TP{world_size} over NCCL on {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    print(f"{'rank':>4}  {'reclaimed (agreed)':>18}  {'measured saving':>15}  "
          f"{'winners stock / plugin':>22}  eviction reads on")  # fmt: skip
    for rank, r in enumerate(ranks):
        stock, plugin = r["stock"], r["plugin"]
        saving = stock["race_peak_bytes"] - plugin["race_peak_bytes"]
        reclaimed = plugin["report"]["reclaimed_bytes"]
        winners = f"{stock['race_winners']} / {plugin['race_winners']}"
        if saving < reclaimed:
            failures.append(f"rank {rank}: saved {saving:,} < reported {reclaimed:,}")
        if stock["race_winners"] != plugin["race_winners"]:
            failures.append(f"rank {rank}: winners differ {winners}")
        if plugin["eviction_devices"] != [f"cuda:{rank}"]:
            failures.append(f"rank {rank}: eviction reads {plugin['eviction_devices']}")
        print(f"{rank:>4}  {reclaimed:>18,}  {saving:>15,}  {winners:>22}  "
              f"{','.join(plugin['eviction_devices'])}")  # fmt: skip
    print("checks:", "all passed" if not failures else "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
