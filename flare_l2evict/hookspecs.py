"""The host contract: the hooks a flare host declares and calls, and what it passes.

``docs/host-contract.md`` walks through it with a host that runs. A host that
does not declare these hooks yet adopts them with::

    pm = pluggy.PluginManager("flare")
    pm.add_hookspecs(flare_l2evict.hookspecs.FlareStartupSpec)
    pm.load_setuptools_entrypoints("flare.plugins", name="l2evict")

Once per GPU process (every rank under tensor parallelism, since
``before_first_capture`` runs a collective on ``runtime.process_group``): load
the checkpoint onto the device; ``before_first_capture(runtime=runtime)``
before any b12x race job or CUDA graph capture; the races and captures, then
size the KV cache (in one of two styles, ``runtime.kv_sizing``: see
:class:`FlareRuntime`); ``startup_complete(runtime=runtime)`` (or
``runtime=report``, the report the first hook returned) once the last race job
has closed. The tensors ``resident_tensors()`` returned stay allocated in
between: the races read them. A change the plugin sees before a read falls
back to stock b12x with the shortfall audited; memory freed from another
thread *while* a race reads it can end the process, as for the host's own kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._markers import ENTRY_POINT_GROUP, PROJECT_NAME, hookimpl, hookspec

if TYPE_CHECKING:
    import torch
    import torch.distributed

    from ._report import ReclaimReport, StartupAudit

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "RUNTIME_ATTRIBUTES",
    "FlareRuntime",
    "FlareStartupSpec",
    "KVAllocator",
    "hookimpl",
    "hookspec",
]


RUNTIME_ATTRIBUTES = (
    "device",
    "rank",
    "world_size",
    "process_group",
    "config",
    "race_jobs",
    "l2_cache_bytes",
    "kv_sizing",
    "kv_allocator",
    "resident_tensors",
)
"""The attributes of :class:`FlareRuntime`, in the order the plugin reads and checks them."""


@runtime_checkable
class KVAllocator(Protocol):
    """The host's KV-cache allocator, as a start-up plugin sees it."""

    def add_reclaimed(self, report: ReclaimReport) -> None:
        """Grow the KV budget by exactly ``report.reclaimed_bytes``.

        Called at most once per start-up by this plugin, before the host sizes
        the KV cache, and only for a host whose budget reserves race memory
        (``runtime.kv_sizing`` missing, ``None`` or ``"reserved"``): a host that
        sizes by measurement is never offered a credit, and may pass
        ``kv_allocator = None``. The figure is already agreed across
        tensor-parallel ranks. It must not call ``before_first_capture`` again
        (such a call credits 0).
        If it raises, the plugin assumes the credit may have been applied: the
        eviction that backs it stays installed until ``startup_complete``. It
        must be a plain function: an ``async def`` one is refused before the
        offer (its coroutine would never run).
        """


@runtime_checkable
class FlareRuntime(Protocol):
    """What the host passes as ``runtime`` to the start-up hooks.

    The plugin reads every attribute once, at the start of
    ``before_first_capture``; a missing, raising or out-of-range one is
    reported in one line naming it and what it accepts (``RuntimeContractError``).

    ``device``
        The process's GPU (``torch.device("cuda", N)``); the reference host
        also accepts ``cpu``.
    ``rank``, ``world_size``, ``process_group``
        Tensor-parallel placement, ``0 <= rank < world_size``; ``process_group``
        is ``None`` for a single process, else the group (exactly
        ``world_size`` ranks, this process at ``rank``) whose ranks must size
        the KV cache alike.
    ``config``
        The deployment config as a mapping; the plugin reads ``plugins.l2evict``.
    ``race_jobs``
        The b12x race jobs this process holds at once during start-up (a whole
        number in ``0..1024``): stock b12x allocates one eviction buffer per job.
    ``l2_cache_bytes``
        The device's L2 size in bytes (``1..4 GiB``), or ``None`` to read it
        from the CUDA device.
    ``kv_sizing``
        Optional, and so not a member of this protocol (a host that predates it
        still conforms). How the host sizes its KV cache, which decides whether
        it takes a credit:

        * ``"reserved"`` (or missing, or ``None``: today's behaviour, the seed's
          flare): the budget sets race memory aside before the races, from a
          figure, not a measurement. The races' stock buffers are in that reserve,
          so the bytes they no longer allocate are invisible to it: the plugin
          offers them to ``kv_allocator.add_reclaimed``.
        * ``"measured"``: the KV cache is sized from memory measured after the
          races or captures (free memory, or the allocator's peak, as SGLang's
          post-capture sizing and vLLM's profiling do). That measurement already
          sees the bytes the races did not allocate, so the plugin installs the
          eviction (kept until ``startup_complete``), offers nothing, and its
          report says why (``reclaimed_bytes = 0``, ``unallocated_bytes``: what
          the races no longer allocate) in one INFO line. Such a host must never
          apply a credit itself, not even the report's ``unallocated_bytes``: it
          would count the same bytes twice, an over-credit.

        Any other value is a contract error (one line naming ``runtime.kv_sizing``,
        0 bytes, stock b12x). Under tensor parallelism every rank must say the same:
        ranks that differ credit 0 on every rank.
    ``kv_allocator``
        See :class:`KVAllocator`; ``None`` (or missing) is accepted when
        ``kv_sizing`` is ``"measured"``, since nothing is offered.
    ``resident_tensors()``
        The checkpoint tensors as loaded, by name (called once): the model's
        own tensors or views of them, not copies (a storage nothing but the
        plugin would hold is not credited). Storages that overlap count once.
        The plugin only reads them, keeps no weak reference on them (the host's
        ``torch.utils.swap_tensors`` works as without it) and no reference at
        all after ``startup_complete``; they stay allocated until then.
    """

    device: torch.device
    rank: int
    world_size: int
    process_group: torch.distributed.ProcessGroup | None
    config: Mapping[str, Any]
    race_jobs: int
    l2_cache_bytes: int | None
    kv_allocator: KVAllocator | None

    def resident_tensors(self) -> Mapping[str, torch.Tensor]: ...


class FlareStartupSpec:
    """Hook specifications of the flare start-up path (``pm.add_hookspecs`` this class)."""

    @hookspec
    def before_first_capture(self, runtime: FlareRuntime) -> ReclaimReport | None:
        """The checkpoint is resident; no race job or graph capture has started.

        Called once per start-up, on every rank. A plugin that frees start-up
        memory hands a :class:`ReclaimReport` to
        ``runtime.kv_allocator.add_reclaimed`` itself (not for a host whose
        ``runtime.kv_sizing`` is ``"measured"``) and returns the same report for
        the host's log. The host must not credit returned reports a second
        time. A second call before ``startup_complete`` (re-entrant, from
        another thread, or repeated) credits 0 and changes nothing.
        """

    @hookspec
    def startup_complete(self, runtime: FlareRuntime) -> StartupAudit | None:
        """Start-up races and captures are over; restore and release everything.

        A plugin that changed the races returns a :class:`StartupAudit` of what
        they really did (evictions asked and served, stock buffers made after
        the credit) for the host's log; it has already logged one line of it.
        A start-up belongs to its runtime: called with another runtime than the
        one ``before_first_capture`` got (a second model's), or with ``None``
        while its credit stands, it changes nothing and logs one line. The
        report ``before_first_capture`` returned ends it too. It never raises
        an ``Exception``.
        """
