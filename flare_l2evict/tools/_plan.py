"""Plan offline: what the plugin would read and reclaim on each rank, from headers alone."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

from .._credit import stock_buffer_bytes
from .._decision import Storages
from .._settings import L2EvictSettings
from .._text import shown
from ._headers import TensorHeader
from ._inputs import DISABLED
from ._kv import kv_tokens
from ._plan_decision import Decision, decide

log = logging.getLogger("flare_l2evict.tools.plan")

_ALLOCATION = 512  # torch's CUDA allocator rounds every tensor it loads to this


@dataclass(frozen=True)
class RankPlan:
    """One rank's choice, as ``before_first_capture`` would make it."""

    rank: int
    tensor: str | None
    storage_bytes: int
    sources: tuple[str, ...]
    window_bytes: int
    reclaimed_bytes: int
    kv_tokens_gained: int | None
    reason: str | None


@dataclass(frozen=True)
class Plan:
    """Every rank's plan and the figure all ranks would agree on (the minimum)."""

    ranks: tuple[RankPlan, ...]
    agreed_reclaimed_bytes: int
    agreed_kv_tokens_gained: int | None
    tensors: int
    files: int
    estimate: str | None

    def as_dict(self) -> dict[str, Any]:
        """Every figure, with tensor names cut as the table cuts them (:func:`cut_name`).

        A 1,000,000-character name costs at most :data:`NAME_LIMIT` characters
        wherever it appears; ``tensor_chars`` keeps its full length and
        ``names_cut`` counts the names of the rank that were cut.
        """
        data = asdict(self)
        for rank in data["ranks"]:
            names = [rank["tensor"], *rank["sources"]]
            rank["tensor_chars"] = None if rank["tensor"] is None else len(rank["tensor"])
            rank["names_cut"] = sum(n is not None and len(n) > NAME_LIMIT for n in names)
            rank["tensor"] = None if rank["tensor"] is None else cut_name(rank["tensor"])
            rank["sources"] = [cut_name(name) for name in rank["sources"]]
        data["name_limit"] = NAME_LIMIT
        return data


NAME_LIMIT = 80
"""Characters of a tensor name ``plan`` prints, in its table and in its JSON."""


def cut_name(name: str) -> str:
    """``name`` whole up to :data:`NAME_LIMIT` characters, else cut as the table cuts it.

    A cut name is the table's cell: hidden characters escaped, ending in
    ``...[N chars]`` with N its full length.
    """
    return name if len(name) <= NAME_LIMIT else shown(name, NAME_LIMIT)


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
    """Start-up's own decision (:func:`flare_l2evict.decide`) on one rank's tensors.

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


def plan_rank(
    rank: int,
    shard: Shard,
    settings: L2EvictSettings,
    *,
    l2_cache_bytes: int,
    race_jobs: int,
    kv_bytes_per_token: int | None,
) -> RankPlan:
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
    return RankPlan(
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


def make_plan(
    shards: Sequence[Shard],
    settings: L2EvictSettings,
    *,
    tensors: int,
    files: int,
    l2_cache_bytes: int,
    race_jobs: int,
    kv_bytes_per_token: int | None,
    estimate: str | None = None,
) -> Plan:
    """Plan every rank and agree on the minimum, as the plugin does at start-up."""
    planned: dict[int, RankPlan] = {}  # identical shards (an even split) are planned once
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
        ranks.append(replace(planned[id(shard)], rank=rank))
    agreed = min(r.reclaimed_bytes for r in ranks)
    return Plan(
        ranks=tuple(ranks),
        agreed_reclaimed_bytes=agreed,
        agreed_kv_tokens_gained=None
        if kv_bytes_per_token is None
        else kv_tokens(agreed, kv_bytes_per_token),
        tensors=tensors,
        files=files,
        estimate=estimate,
    )
