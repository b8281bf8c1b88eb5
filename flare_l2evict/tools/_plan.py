"""Plan offline: what the plugin would read and reclaim on each rank, from headers alone.

:func:`decide` is start-up's own choice (:func:`~flare_l2evict._decision.choose_regions`)
followed by start-up's own credit (:func:`~flare_l2evict._credit.credit`), from what a
caller knows: ``plan`` on each rank's shard, ``check`` on this rank's checkpoint. A
server's start-up calls the same two functions itself, so what the tools print is what
start-up does (``tests/test_plan_matches_startup.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pydantic import Field, NonNegativeInt, computed_field, field_serializer

from .._credit import Credit, credit, stock_buffer_bytes
from .._decision import Region, RegionChoice, Storages, choose_regions
from .._settings import DISABLED, L2EvictSettings
from .._text import shown
from ._headers import TensorHeader
from ._json_output import Output

log = logging.getLogger("flare_l2evict.tools.plan")

_ALLOCATION = 512  # torch's CUDA allocator rounds every tensor it loads to this

NAME_LIMIT = 80
"""Characters of a tensor name the tools print, in their tables and in their JSON."""


def cut_name(name: str) -> str:
    """``name`` whole up to :data:`NAME_LIMIT` characters, else cut as the table cuts it.

    A cut name is the table's cell: hidden characters escaped, ending in
    ``...[N chars]`` with N its full length.
    """
    return name if len(name) <= NAME_LIMIT else shown(name, NAME_LIMIT)


def kv_tokens(nbytes: int, bytes_per_token: int) -> int:
    """Whole tokens that ``nbytes`` of KV cache hold: ``floor(nbytes / bytes_per_token)``.

    A token needs all of its bytes, so a part of one never counts; a negative byte count
    holds none. ``plan``'s "KV tokens gained" is this of the credit, and the reference
    host's KV cache is this of its own budget plus this of the credit, so the two always
    agree on what the credit adds.
    """
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token = {bytes_per_token}: must be positive")
    return max(0, nbytes) // bytes_per_token


@dataclass(frozen=True)
class Decision:
    """:func:`decide`'s answer: the choice, and the credit with its reason when it is 0."""

    chosen: RegionChoice
    credit: Credit

    @property
    def window_bytes(self) -> int:
        return self.chosen.window_bytes

    @property
    def read_bytes(self) -> int:
        return self.chosen.read_bytes

    @property
    def regions(self) -> tuple[Region, ...]:
        return self.chosen.regions


RACE_JOBS_FLAG = "--race-jobs J"
"""Where plan's and check's race jobs come from (else the profile's): what a fix of 0 names."""


def decide(
    storages: Storages,
    *,
    window_bytes: int,
    exclude: Sequence[str],
    race_jobs: int,
    stock_buffer_bytes: int,
    blocked: str | None = None,
    where: str = "the device",
) -> Decision:
    """What start-up installs and credits, given what the caller knows.

    ``blocked`` is why nothing can be installed whatever the storages (b12x's seam failed
    its proof, the plugin is disabled), or ``None``. The credit is start-up's credit of
    the choice; its reason, when it is 0, is the first of: ``blocked``, the choice's
    shortfall, the credit's own.
    """
    choice = choose_regions(storages, window_bytes, exclude, where=where)
    if blocked is not None:
        return Decision(choice, Credit(0, blocked))
    if choice.shortfall is not None:
        return Decision(choice, Credit(0, choice.shortfall))
    granted = credit(
        installable=True,
        race_jobs=race_jobs,
        stock_buffer_bytes=stock_buffer_bytes,
        window_bytes=window_bytes,
        read_bytes=choice.read_bytes,
        race_jobs_from=RACE_JOBS_FLAG,
    )
    return Decision(choice, granted)


class Shard(NamedTuple):
    """One rank's tensors as the plan needs them: names and storage bytes."""

    names: list[str]
    sizes: list[int]


def shard_of(tensors: Sequence[TensorHeader]) -> Shard:
    """A pre-sharded rank's tensors, as they are."""
    return Shard([t.name for t in tensors], [t.nbytes for t in tensors])


def split_evenly(tensors: Sequence[TensorHeader], tp: int, dim: int) -> tuple[list[Shard], str]:
    """Estimate each rank's shard of an unsharded checkpoint.

    Rule: a tensor with more than ``dim`` dimensions whose size along ``dim``
    divides by ``tp`` is split evenly along it; every other tensor (a 0-d
    one, or one with ``dim`` or fewer dimensions) is replicated on every
    rank. Returns the shards and the rule in words.
    """
    if dim < 0:
        # shape[-1] would silently mean the last dim, and a 0-d tensor has none.
        raise ValueError(f"split dim {dim} is negative; dims count from 0")
    sizes = [
        t.nbytes // tp
        if len(t.shape) > dim and t.shape[dim] and t.shape[dim] % tp == 0
        else t.nbytes
        for t in tensors
    ]
    # An even split gives every rank the same shard: one object serves them all.
    shard = Shard([t.name for t in tensors], sizes)
    rule = (
        f"estimate: an unsharded checkpoint split evenly along dim {dim} where it divides by "
        f"{tp}, replicated otherwise (--split-dim changes the dim; pass per-rank files with "
        "--per-rank for exact figures)"
    )
    return [shard] * tp, rule


def decide_shard(
    shard: Shard,
    settings: L2EvictSettings,
    *,
    l2_cache_bytes: int,
    race_jobs: int,
    stock_buffer_bytes: int,
    blocked: str | None = None,
) -> Decision:
    """Start-up's own decision (:func:`decide`) on one rank's tensors.

    safetensors' loader gives each tensor a storage of its own, so each gets an
    address range of its own, apart from every other; shared by ``plan`` and
    ``check``.
    """
    starts: list[int] = []
    address = _ALLOCATION
    for size in shard.sizes:
        starts.append(address)
        address += -(-max(size, 1) // _ALLOCATION) * _ALLOCATION
    if not settings.enabled:
        blocked = DISABLED
    return decide(
        Storages(shard.names, list(shard.sizes), starts),
        window_bytes=settings.window_bytes(l2_cache_bytes),
        exclude=settings.exclude,
        race_jobs=race_jobs,
        stock_buffer_bytes=stock_buffer_bytes,
        blocked=blocked,
        where="this rank's checkpoint",
    )


class PlanRank(Output):
    """One rank's plan: what start-up would read and credit there.

    It holds tensor names whole; printed, each is cut to :data:`NAME_LIMIT` characters
    (``tensor_chars`` keeps the first one's length, ``names_cut`` counts the cut ones).
    """

    rank: NonNegativeInt = Field(description="The rank.")
    tensor: str | None = Field(
        description=f"The first tensor read (cut to {NAME_LIMIT} characters), or null."
    )
    storage_bytes: NonNegativeInt = Field(description="Bytes of the storages read.")
    sources: tuple[str, ...] = Field(description="Every tensor read, each cut as tensor is.")
    window_bytes: NonNegativeInt = Field(description="Bytes read per eviction.")
    reclaimed_bytes: NonNegativeInt = Field(description="What this rank alone would credit.")
    kv_tokens_gained: NonNegativeInt | None = Field(
        description="Whole KV tokens of reclaimed_bytes."
    )
    reason: str | None = Field(
        description="Why this rank credits 0 (it falls back, or is disabled by config), or null."
    )

    @computed_field(description="tensor's full length, uncut.")  # type: ignore[prop-decorator]
    @property
    def tensor_chars(self) -> NonNegativeInt | None:
        return None if self.tensor is None else len(self.tensor)

    @computed_field(description="Names of this rank that were cut.")  # type: ignore[prop-decorator]
    @property
    def names_cut(self) -> NonNegativeInt:
        names = [self.tensor, *self.sources]
        return sum(name is not None and len(name) > NAME_LIMIT for name in names)

    @field_serializer("tensor")
    def _tensor_cut(self, tensor: str | None) -> str | None:
        return None if tensor is None else cut_name(tensor)

    @field_serializer("sources")
    def _sources_cut(self, sources: tuple[str, ...]) -> list[str]:
        return [cut_name(name) for name in sources]


def plan_rank(
    rank: int,
    shard: Shard,
    settings: L2EvictSettings,
    *,
    l2_cache_bytes: int,
    race_jobs: int,
    kv_bytes_per_token: int | None,
) -> PlanRank:
    """The plugin's choice for one rank, as start-up would make it on the loaded tensors."""
    decision = decide_shard(
        shard,
        settings,
        l2_cache_bytes=l2_cache_bytes,
        race_jobs=race_jobs,
        stock_buffer_bytes=stock_buffer_bytes(l2_cache_bytes),
    )
    reclaimed = decision.credit.nbytes
    sources = decision.regions if reclaimed else ()
    return PlanRank(
        rank=rank,
        tensor=sources[0].name if sources else None,
        storage_bytes=sum(source.storage_bytes for source in sources),
        sources=tuple(source.name for source in sources),
        window_bytes=decision.window_bytes,
        reclaimed_bytes=reclaimed,
        kv_tokens_gained=None
        if kv_bytes_per_token is None
        else kv_tokens(reclaimed, kv_bytes_per_token),
        reason=decision.credit.reason,
    )


def plan_ranks(
    shards: Sequence[Shard],
    settings: L2EvictSettings,
    *,
    l2_cache_bytes: int,
    race_jobs: int,
    kv_bytes_per_token: int | None,
) -> list[PlanRank]:
    """Every rank's plan, in rank order; identical shards (an even split) planned once."""
    planned: dict[int, PlanRank] = {}
    ranks = []
    debug = log.isEnabledFor(logging.DEBUG)
    if debug:
        _log_basis(settings, l2_cache_bytes, race_jobs)
    for rank, shard in enumerate(shards):
        if id(shard) not in planned:
            if debug:
                same = sum(other is shard for other in shards) - 1
                also = (
                    f" (and {same:,} other rank{'s' * (same > 1)} with its shard)" if same else ""
                )
                log.debug("flare_l2evict: plan: rank %d's decision%s", rank, also)
            planned[id(shard)] = plan_rank(
                rank,
                shard,
                settings,
                l2_cache_bytes=l2_cache_bytes,
                race_jobs=race_jobs,
                kv_bytes_per_token=kv_bytes_per_token,
            )
        ranks.append(planned[id(shard)].model_copy(update={"rank": rank}))
    return ranks


def _log_basis(settings: L2EvictSettings, l2_cache_bytes: int, race_jobs: int) -> None:
    log.debug(
        "flare_l2evict: plan's basis: stock buffer %s bytes per race job (formula max(2 x L2, "
        "64 MiB): offline, no seam is measured), window %s bytes (%s), L2 %s bytes, %d race jobs",
        f"{stock_buffer_bytes(l2_cache_bytes):,}",
        f"{settings.window_bytes(l2_cache_bytes):,}",
        settings.window,
        f"{l2_cache_bytes:,}",
        race_jobs,
    )
