"""The reference host: what a flare process does around the start-up hooks.

A test and demo harness, not a server. It loads plugins the way flare does
(``flare.plugins`` entry points, only those named by ``--plugin``), loads a
checkpoint, calls the hooks in the documented order, starts b12x race jobs
through b12x's own seam, and sizes the KV cache in either style of the contract
(``kv_sizing``): *reserved*, a budget that sets stock's buffers aside before the
races and grows by the credit, or *measured*, a budget sized from what the races
were measured to hold, which takes no credit.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pluggy
import torch

from ..._credit import EVICTION_OUTPUT_BYTES, stock_buffer_bytes
from ..._errors import L2EvictError, PluginNotFoundError
from ..._markers import ENTRY_POINT_GROUP, PROJECT_NAME
from ..._report import ReclaimReport, StartupAudit
from ..._request import KVSizing
from ...hookspecs import FlareStartupSpec
from .._inputs import refuse_unknown_plugins
from .._machine_memory import refuse_what_this_machine_cannot_hold
from .._origin import stock_row
from .._plan import kv_tokens
from .._profiles import DeviceProfile
from .._startup_arm import StartupArm
from ._checkpoint import load_checkpoint

log = logging.getLogger("flare_l2evict.tools.reference_host")
Eviction = Literal["weights", "stock", "none"]
"""What one race job's eviction reads (:attr:`StartupArm.job_evictions`)."""


class ReferenceKVAllocator:
    """Budget = device memory - loaded - what the races hold + reclaimed.

    What the races hold is the eviction reserve for a *reserved* host (stock's
    buffers, set aside before the races), or what they were measured to hold for a
    *measured* one, whose ``reclaimed_bytes`` stays 0: the plugin never calls its
    :meth:`add_reclaimed`, and if it did the budget would show the double count.

    Tokens: the whole tokens of the budget without the credit, plus the whole
    tokens of the credit (:func:`~flare_l2evict.tools._plan.kv_tokens` of each),
    so the credit adds exactly what ``plan`` says it gains.
    """

    def __init__(
        self, bytes_per_token: int, free_bytes: int | None = None, where: str = "the device"
    ) -> None:
        if bytes_per_token <= 0:
            raise ValueError("bytes_per_token must be positive")
        self.bytes_per_token = bytes_per_token
        self.where = where
        self.free_bytes = free_bytes
        """Memory free on the device when the hook runs: no credit past it can be backed."""
        self.reclaimed_bytes = 0
        self.cut_bytes = 0
        """What a credit asked beyond :attr:`free_bytes`, and this allocator did not take."""
        self.reports: list[ReclaimReport] = []

    def add_reclaimed(self, report: ReclaimReport) -> None:
        self.reports.append(report)
        room = None if self.free_bytes is None else max(0, self.free_bytes - self.reclaimed_bytes)
        taken = report.reclaimed_bytes if room is None else min(report.reclaimed_bytes, room)
        if taken < report.reclaimed_bytes:
            # A credit no memory on the device could back is an over-report, whatever the
            # arithmetic: the budget it would grow does not exist.
            self.cut_bytes += report.reclaimed_bytes - taken
            log.warning(
                "flare_l2evict: reference host: the credit of %s bytes is more than the %s "
                "bytes free on %s at before_first_capture; %s bytes taken",
                f"{report.reclaimed_bytes:,}",
                f"{self.free_bytes:,}",
                self.where,
                f"{taken:,}",
            )
        self.reclaimed_bytes += taken

    def budget(self, memory_bytes: int, loaded_bytes: int, reserve_bytes: int) -> int:
        return max(0, memory_bytes - loaded_bytes - reserve_bytes + self.reclaimed_bytes)

    def tokens(self, memory_bytes: int, loaded_bytes: int, reserve_bytes: int) -> int:
        """KV tokens of :meth:`budget`: own budget's whole tokens plus the credit's."""
        own = memory_bytes - loaded_bytes - reserve_bytes
        if own < 0:  # the credit first pays off what the checkpoint overran
            return kv_tokens(own + self.reclaimed_bytes, self.bytes_per_token)
        return kv_tokens(own, self.bytes_per_token) + kv_tokens(
            self.reclaimed_bytes, self.bytes_per_token
        )


@dataclass
class ReferenceRuntime:
    """The ``runtime`` object of the host contract (:class:`flare_l2evict.FlareRuntime`)."""

    device: torch.device
    config: Mapping[str, Any]
    kv_allocator: ReferenceKVAllocator
    race_jobs: int
    l2_cache_bytes: int | None
    tensors: dict[str, torch.Tensor] = field(repr=False)
    rank: int = 0
    world_size: int = 1
    process_group: Any = None
    kv_sizing: KVSizing = "reserved"
    """How this host sizes its KV cache (``runtime.kv_sizing`` of the contract)."""

    def resident_tensors(self) -> Mapping[str, torch.Tensor]:
        return self.tensors


def plugin_manager(plugins: Sequence[str]) -> pluggy.PluginManager:
    """A flare plugin manager holding exactly the named entry-point plugins."""
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(FlareStartupSpec)
    for name in plugins:
        if (
            pm.get_plugin(name) is None
            and pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name) == 0
        ):
            refuse_unknown_plugins([name])  # its one line, as the CLI says it before torch
            raise PluginNotFoundError(
                f"--plugin {name}: its flare.plugins entry point registered no plugin; "
                "fix: reinstall the package that provides it"
            )
    return pm


def _stock_seam() -> Callable[..., Any] | None:
    return stock_row().loaded()  # the seam of the loaded b12x, as the seam table names it


def _storage_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors.values():
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class ReferenceHost:
    """One flare process's start-up, around the two hooks.

    ``profile`` supplies memory, L2 and race jobs on a CPU; on a CUDA device
    memory and L2 are read from the device and only ``race_jobs`` is used.
    """

    def __init__(
        self,
        *,
        plugins: Sequence[str] = (),
        config: Mapping[str, Any] | None = None,
        device: torch.device | str = "cpu",
        profile: DeviceProfile,
        kv_bytes_per_token: int,
        rank: int = 0,
        world_size: int = 1,
        process_group: Any = None,
        kv_sizing: KVSizing = "reserved",
    ) -> None:
        self.plugins = tuple(plugins)
        self.kv_sizing = kv_sizing
        self.config = dict(config or {})
        self.device = torch.device(device)
        self.profile = profile
        self.kv_bytes_per_token = kv_bytes_per_token
        self.rank, self.world_size, self.process_group = rank, world_size, process_group
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise L2EvictError(f"--device {device}: CUDA is not available here; fix: --device cpu")
        self.pm = plugin_manager(self.plugins)
        self.events: list[str] = []

    def _device_figures(self) -> tuple[int, int]:
        if self.device.type == "cuda":
            properties = torch.cuda.get_device_properties(self.device)
            return int(properties.total_memory), int(properties.L2_cache_size)
        return self.profile.memory_bytes, self.profile.l2_cache_bytes

    def start(
        self, checkpoint: str | Path | Sequence[str | Path] | Mapping[str, torch.Tensor]
    ) -> StartupArm:
        """Load, call the hooks, start the race jobs, size the KV cache.

        ``checkpoint``: tensors, one .safetensors file, or several files and/or
        ``*.index.json`` files naming one checkpoint (read as ``plan`` reads them).
        """
        memory, l2 = self._device_figures()
        cuda = self.device.type == "cuda"
        if cuda:
            # What an earlier start-up (or test) in this process left, as garbage or cached,
            # would move this one's figures: each starts as a fresh process would.
            gc.collect()
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            before = torch.cuda.memory_allocated(self.device)
        if isinstance(checkpoint, Mapping):
            tensors = {k: v.to(self.device) for k, v in checkpoint.items()}
        elif isinstance(checkpoint, (str, Path)):
            if self.device.type == "cpu":  # a GPU's load maps the file, and copies to the GPU
                refuse_what_this_machine_cannot_hold([Path(checkpoint)])
            tensors = load_checkpoint(checkpoint, self.device)
        else:
            tensors = _load_files([Path(p) for p in checkpoint], self.device)
        loaded = (
            torch.cuda.memory_allocated(self.device) - before if cuda else _storage_bytes(tensors)
        )
        self.events.append("checkpoint loaded")
        free = _free_bytes(self.device) if cuda else max(0, memory - loaded)
        allocator = ReferenceKVAllocator(self.kv_bytes_per_token, free, self._where())
        runtime = ReferenceRuntime(
            device=self.device,
            config=self.config,
            kv_allocator=allocator,
            race_jobs=self.profile.race_jobs,
            l2_cache_bytes=None if cuda else l2,
            tensors=tensors,
            rank=self.rank,
            world_size=self.world_size,
            process_group=self.process_group,
            kv_sizing=self.kv_sizing,
        )
        if cuda:
            # The hook collects young garbage itself: collected here first, so what it frees
            # is not taken for a negative allocation of the plugin's.
            gc.collect()
            torch.cuda.synchronize(self.device)
            hook_base = torch.cuda.memory_allocated(self.device)
        self.events.append("before_first_capture")
        results = self.pm.hook.before_first_capture(runtime=runtime)
        report = next((r for r in results if isinstance(r, ReclaimReport)), None)
        # What the plugins themselves allocate counts as eviction storage too.
        hook_bytes = torch.cuda.memory_allocated(self.device) - hook_base if cuda else 0
        try:
            jobs = self._start_race_jobs(l2, hook_bytes, free)
        finally:
            self.events.append("startup_complete")
            audits = self.pm.hook.startup_complete(runtime=runtime)
        audit = next((a for a in audits if isinstance(a, StartupAudit)), None)
        reserve = self.profile.race_jobs * stock_buffer_bytes(l2)
        # Reserved: stock's buffers set aside before the races, then the credit added.
        # Measured: what the races were measured to hold, and no credit (0 unless a plugin
        # broke the contract, which the budget would then show as a double count).
        measured = None if self.kv_sizing == "reserved" else jobs.held_bytes
        held = reserve if measured is None else measured
        return StartupArm(
            plugins=self.plugins,
            device=str(self.device),
            memory_bytes=memory,
            l2_cache_bytes=l2,
            race_jobs=self.profile.race_jobs,
            loaded_bytes=loaded,
            eviction_reserve_bytes=reserve,
            eviction_storage_bytes=jobs.storage_bytes,
            eviction_measured=jobs.measured,
            reclaimed_bytes=allocator.reclaimed_bytes,
            # A start-up whose races run out of memory serves no KV cache at all.
            kv_budget_bytes=0 if jobs.out_of_memory else allocator.budget(memory, loaded, held),
            kv_tokens=0 if jobs.out_of_memory else allocator.tokens(memory, loaded, held),
            report=report,
            job_evictions=jobs.evictions,
            race_winners=jobs.winners,
            race_peak_bytes=jobs.peak_bytes,
            cute_guard_stand_in=jobs.cute_guard_stand_in,
            audit=audit,
            kv_sizing=self.kv_sizing,
            measured_race_bytes=measured,
            free_after_races_bytes=jobs.free_bytes,
            free_at_hook_bytes=free,
            credit_cut_bytes=allocator.cut_bytes,
            out_of_memory=jobs.out_of_memory,
        )

    def _where(self) -> str:
        """The device in words: on a CPU, the profile's device it stands in for."""
        if self.device.type == "cuda":
            return str(self.device)
        return f"the {self.profile.name} profile's device"

    def _out_of_memory(self, stock_jobs: int, l2: int, free: int) -> str | None:
        """Why ``stock_jobs`` stock buffers cannot all exist on the device, or ``None``."""
        need = stock_jobs * stock_buffer_bytes(l2)
        if need <= free:
            return None
        return (
            f"stock's {stock_jobs:,} x {stock_buffer_bytes(l2):,}-byte buffers ({need:,} bytes) "
            f"do not fit the {free:,} bytes free on {self._where()} after the checkpoint: "
            "the races run out of memory"
        )

    def _start_race_jobs(self, l2: int, hook_bytes: int, free: int) -> _RaceJobs:
        """Start the race jobs the way ``PreparationJob._measure`` does, all alive at once.

        Each job asks b12x's seam for its eviction and keeps it. On CUDA the
        storage those evictions allocate is measured (plus ``hook_bytes``, what
        the plugins allocated in the hook), and each job then runs a real b12x
        race with it; on a CPU stock's buffers cannot be made, so a job that
        gets no eviction from the plugin is counted at stock's size, and the
        plugin's eviction at its own outputs' size.
        """
        seam = _stock_seam()
        cuda = self.device.type == "cuda"
        if cuda and seam is None:
            raise L2EvictError(
                "b12x is not importable, so no race job can start on CUDA; "
                "fix: pip install 'flashinfer-python>=0.7.2' (or b12x>=1.5)"
            )
        if not cuda:
            evictions: list[Callable[[], None] | None] = []
            for index in range(self.profile.race_jobs):
                self.events.append(f"race job {index} starts")
                eviction = None
                if seam is not None and getattr(seam, "__flare_l2evict__", False):
                    eviction = seam(self.device, enabled=True)
                if eviction is not None and _reads_weights(eviction):
                    eviction()
                evictions.append(eviction)
            modelled = sum(stock_buffer_bytes(l2) for e in evictions if not _reads_weights(e))
            if any(map(_reads_weights, evictions)):
                modelled += EVICTION_OUTPUT_BYTES  # the plugin's own outputs, once per process
            # A job the plugin does not serve is counted at stock's buffer, so it reads
            # "stock": stock b12x cannot make its buffer on a CPU, but would on the GPU.
            kinds: tuple[Eviction, ...] = tuple(
                "weights" if _reads_weights(e) else "stock" for e in evictions
            )
            oom = self._out_of_memory(kinds.count("stock"), l2, free)
            return _RaceJobs(modelled, False, kinds, out_of_memory=oom)
        from ._races import cute_guard, gemm_candidates, run_race

        calls = gemm_candidates(self.device)
        for call in calls:
            call.run()  # cuBLAS's workspace is allocated now, not inside the measurement
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        assert seam is not None  # checked above for CUDA
        if not getattr(seam, "__flare_l2evict__", False):  # stock's seam: every job allocates
            oom = self._out_of_memory(self.profile.race_jobs, l2, free)
            if oom is not None:  # said in words, before torch's OutOfMemoryError would say it
                stock: Eviction = "stock"
                return _RaceJobs(0, True, (stock,) * self.profile.race_jobs, out_of_memory=oom)
        evictions = []
        for index in range(self.profile.race_jobs):
            self.events.append(f"race job {index} starts")
            evictions.append(seam(self.device, enabled=True))
        torch.cuda.synchronize(self.device)
        storage = torch.cuda.memory_allocated(self.device) - base + hook_bytes
        with cute_guard() as stand_in:
            winners = tuple(run_race(calls, self.device, e).winner for e in evictions)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base + hook_bytes
        free = int(torch.cuda.mem_get_info(self.device)[0])  # the jobs still hold their evictions
        names = tuple(map(_kind, evictions))
        evictions.clear()
        return _RaceJobs(storage, True, names, winners, peak, stand_in, free)


def _free_bytes(device: torch.device) -> int:
    """Memory free to torch on a CUDA device: the driver's, and what torch's cache holds unused."""
    free = int(torch.cuda.mem_get_info(device)[0])
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _load_files(paths: list[Path], device: torch.device) -> dict[str, torch.Tensor]:
    """One checkpoint given as files and/or indexes: each file loaded once, as an index names it.

    The headers are read first, as ``plan`` and ``check`` read them, so an
    index, a missing shard or a tensor in two files gets their one-line error.
    """
    missing = next((path for path in paths if not path.exists()), None)
    if missing is not None:
        return load_checkpoint(missing, device)  # its one line: no such checkpoint, and the fix
    from .._headers import read_checkpoint

    wanted: dict[str, set[str]] = {}
    for header in read_checkpoint(paths):
        wanted.setdefault(header.file, set()).add(header.name)
    if device.type == "cpu":
        refuse_what_this_machine_cannot_hold([Path(file) for file in wanted])
    tensors: dict[str, torch.Tensor] = {}
    for file, names in wanted.items():
        loaded = load_checkpoint(file, device)
        tensors |= {name: loaded[name] for name in sorted(names)}
    return tensors


@dataclass(frozen=True)
class _RaceJobs:
    storage_bytes: int
    measured: bool
    evictions: tuple[Eviction, ...]
    winners: tuple[int, ...] = ()
    peak_bytes: int | None = None
    cute_guard_stand_in: bool = False
    free_bytes: int | None = None
    out_of_memory: str | None = None

    @property
    def held_bytes(self) -> int:
        """What the races held, as a measuring host sees it: the allocator's peak on CUDA;
        on a CPU the storage counted (stock's buffers made, the plugin's outputs)."""
        return self.storage_bytes if self.peak_bytes is None else self.peak_bytes


def _reads_weights(eviction: object) -> bool:
    from ..._eviction import EvictionHandle

    return isinstance(eviction, EvictionHandle)


def _kind(eviction: object) -> Eviction:
    if eviction is None:
        return "none"
    return "weights" if _reads_weights(eviction) else "stock"
