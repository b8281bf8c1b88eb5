"""Rank bodies for the gloo tests: real processes, real torch.distributed, real pluggy.

Imported by spawned children (multiprocessing passes the parent's sys.path).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

import flare_l2evict
from support.figures import MiB

if TYPE_CHECKING:
    from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime


class RaisingRuntimeStandIn:
    """A host runtime whose resident_tensors() blows up, as a broken host would."""

    kv_allocator: ReferenceKVAllocator  # copied from the runtime it stands in for

    def __init__(self, base: object) -> None:
        self.__dict__.update(base.__dict__)

    def resident_tensors(self) -> object:
        raise RuntimeError("host lost its checkpoint")


class LateRuntimeStandIn:
    """A host runtime whose resident_tensors() returns only once every other rank's hook has
    returned: this rank reaches the agreement after the others stopped waiting for it.

    Waiting for the others' word, not sleeping past their wait, makes "after" certain on a
    loaded machine and costs only the others' bounded wait.
    """

    kv_allocator: ReferenceKVAllocator
    tensors: dict[str, torch.Tensor]

    def __init__(self, base: object, others_done: Callable[[], None]) -> None:
        self.__dict__.update(base.__dict__)
        self.others_done = others_done

    def resident_tensors(self) -> object:
        self.others_done()
        return self.tensors


def _runtime(
    scenario: str, rank: int, world_size: int, events: distributed_c10d.Store
) -> ReferenceRuntime | RaisingRuntimeStandIn | LateRuntimeStandIn:
    from flare_l2evict.tools.reference_host import ReferenceKVAllocator, ReferenceRuntime

    # Each rank holds its own shard: a 64 MiB expert block per rank.
    tensors = {f"model.layers.3.mlp.experts.w13_weight.rank{rank}": torch.zeros(16 * MiB)}
    config: dict[str, object] = {}
    race_jobs = 5
    if scenario == "no_storage" and rank == 1:
        tensors = {"model.norm.weight": torch.zeros(16)}
    if scenario == "config_differs" and rank == world_size - 1:
        config = {"plugins": {"l2evict": {"window": "96MiB"}}}
    if scenario == "fewer_jobs" and rank == 1:
        race_jobs = 3
    if scenario in ("raises_raise", "differs_raise"):
        config = {"plugins": {"l2evict": {"on_error": "raise"}}}
    if scenario == "differs_raise" and rank == world_size - 1:
        config = {"plugins": {"l2evict": {"on_error": "raise", "window": "96MiB"}}}
    # Every rank sizes its KV cache by measurement, or only the last does (a contract error).
    measured = scenario == "measured" or (scenario == "measured_one" and rank == world_size - 1)
    runtime = ReferenceRuntime(
        device=torch.device("cpu"),
        config=config,
        kv_allocator=ReferenceKVAllocator(1024),
        race_jobs=race_jobs,
        l2_cache_bytes=16 * MiB,
        tensors=tensors,
        rank=rank,
        world_size=world_size,
        process_group=dist.group.WORLD,
        kv_sizing="measured" if measured else "reserved",
    )
    if scenario == "group_mismatch":
        # Every rank claims world_size ranks but passes a group of one (its own).
        groups = [dist.new_group([r]) for r in range(world_size)]
        runtime.process_group = groups[rank]
    if scenario == "group_none" and rank == 1:
        runtime.process_group = None  # a rank that lost its group: it votes in the default one
    if scenario == "group_junk" and rank == 1:
        runtime.process_group = object()
    if scenario == "group_other":
        # Rank 1 passes a group of its own; the others wait AGREE_TIMEOUT_S, then vote it out.
        groups = [dist.new_group([r]) for r in range(world_size)]
        if rank == 1:
            runtime.process_group = groups[rank]
    if scenario.startswith("raises") and rank == 1:
        return RaisingRuntimeStandIn(runtime)
    if scenario == "late" and rank == 1:
        others = [_LATE_DONE.format(r) for r in range(world_size) if r != 1]
        return LateRuntimeStandIn(runtime, lambda: events.wait(others, timedelta(seconds=120)))
    return runtime


_LATE_DONE = "tests/late/{}"
"""The key a rank sets in the job's store once its hook of the ``late`` scenario returned."""


def worker(rank: int, world_size: int, store: str, out: str, scenarios: list[str]) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    from flare_l2evict import _agree
    from flare_l2evict.tools.reference_host import plugin_manager
    from support.hosts import seam_is_ours

    # The ranks' own word to each other: keys of their own in the job's store, beside the
    # plugin's votes (flare_l2evict/agree/...).
    events = distributed_c10d._get_default_store()
    pm = plugin_manager(["l2evict"])
    results = {}
    for scenario in scenarios:
        # A short wait where a rank is meant to miss the agreement; the default elsewhere.
        _agree.AGREE_TIMEOUT_S = 5.0 if scenario in ("group_other", "late") else 120.0
        runtime = _runtime(scenario, rank, world_size, events)
        if scenario == "program_block_first" and rank == 1:
            # A warm-up benchmark on one rank only: its block must not be counted as this
            # rank's share of the next tensor-parallel agreement.
            with flare_l2evict.evicting_from(
                {"warm.w": torch.zeros(128 * MiB // 4)}, race_jobs=2, l2_cache_bytes=16 * MiB
            ):
                pass
        try:
            (report,) = pm.hook.before_first_capture(runtime=runtime)
            results[scenario] = {
                "report": report.model_dump(mode="json"),
                "credited": runtime.kv_allocator.reclaimed_bytes,
                "offers": len(runtime.kv_allocator.reports),
                "installed": seam_is_ours(),  # races read the weights until startup_complete
            }
        except Exception as error:
            results[scenario] = {"raised": f"{type(error).__name__}: {error}"}
            results[scenario]["trace"] = traceback.format_exc(limit=2)
            results[scenario]["credited"] = runtime.kv_allocator.reclaimed_bytes
        if scenario == "late" and rank != 1:
            events.set(_LATE_DONE.format(rank), "returned")  # rank 1 may come now: too late
        pm.hook.startup_complete(runtime=runtime)
        dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
    # Results are on disk. Skip interpreter teardown: about one run in three, a C++
    # thread still joinable at exit aborts the child (std::terminate) since the
    # seam proof imports b12x's session module; not root-caused yet.
    os._exit(0)


def run_worlds(
    directories: Mapping[int, Path], scenarios: list[str]
) -> dict[int, list[dict[str, Any]]]:
    """Each rank's results of ``scenarios``, by world size: for every world size in
    ``directories``, one process per rank runs :func:`worker`, every world at the same time.

    The worlds share nothing (each has its own store in its own directory); together, the
    agreement's bounded waits of one overlap the others' and the spawns share the cores.
    """
    from torch.multiprocessing.spawn import start_processes

    # One fork server imports torch and the plugin, then forks every rank: six imports of
    # torch on two cores were most of the set-up. It runs no thread and no CUDA to fork over.
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["torch", "torch.distributed", "flare_l2evict", __name__]
    )
    running = [
        start_processes(  # type: ignore[no-untyped-call]
            worker,
            args=(size, str(directory / "store"), str(directory), scenarios),
            nprocs=size,
            join=False,
            start_method="forkserver",
        )
        for size, directory in directories.items()
    ]
    try:
        while running:  # a rank that fails raises here at once, naming its world's error
            running = [context for context in running if not context.join(timeout=1)]
    finally:  # its own world's ranks are ended by then; the other worlds' are ended here
        for process in (p for context in running for p in context.processes):
            if process.is_alive():
                process.kill()
                process.join()
    return {
        size: [json.loads((directory / f"rank{r}.json").read_text()) for r in range(size)]
        for size, directory in directories.items()
    }
