"""Tensor-parallel agreement: every rank hands the KV allocator the same figure.

Who votes, waits and credits what: docs/tensor-parallelism.md. A vote is written
once (``compare_set`` from empty), so a vote written "late" by a rank whose wait
ended is what every rank reads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ._settings import L2EvictSettings
from ._text import literal, shown


@dataclass(frozen=True)
class RankOutcome:
    """What one rank brings to the agreement."""

    rank: int
    reclaimed_bytes: int
    reason: str | None
    settings_digest: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class Agreement:
    """The figure every rank reports, and why it may be lower than this rank's own."""

    reclaimed_bytes: int
    fallback_ranks: dict[int, str]
    reason: str | None


AGREE_TIMEOUT_S = 120.0
"""Seconds a rank waits for the other ranks' votes; then the missing ones are voted out (0)."""

_LATE = "late"
_PREFIX = "flare_l2evict/agree"


def settings_digest(
    settings: L2EvictSettings | None, kv_sizing: str = "reserved"
) -> tuple[str, dict[str, Any]]:
    """A short digest of the settings and the host's KV sizing, so ranks can tell they were
    configured alike (one *measured* rank and one *reserved* is a contract error)."""
    dumped = {} if settings is None else settings.model_dump(mode="json")
    if kv_sizing != "reserved":  # the digest of a reserved host is what it always was
        dumped = {**dumped, "kv_sizing": kv_sizing}
    text = json.dumps(dumped, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12], dumped


def agree(outcome: RankOutcome, group: dist.ProcessGroup | None, number: int) -> Agreement:
    """The minimum reclaimed bytes over the ranks of ``group``; the same on every rank.

    Every rank must call this exactly once per start-up, a faulted one with a zero outcome, so
    nobody waits on a rank that gave up. Ranks whose settings differ, or that miss the wait,
    make the agreed figure 0 and are named. ``number`` is the start-up's agreement round: every
    rank's n-th start-up that agrees passes the same, so its votes get keys of their own.
    """
    alone = Agreement(outcome.reclaimed_bytes, {}, outcome.reason)
    if not dist.is_available() or not dist.is_initialized():
        return alone
    store = _default_store()
    members = _members(group)
    if members is None:
        # No group to agree in: vote into the whole job's slot, so that ranks whose
        # group is the whole job read this vote at once instead of waiting for it.
        if store is not None and dist.get_world_size() > 1:
            every = list(range(dist.get_world_size()))
            _vote(store, _keys(every, number)[dist.get_rank()], outcome)
        return alone
    if len(members) == 1:
        return alone
    gathered = _gather(store, group, members, number, outcome)
    return gathered if isinstance(gathered, Agreement) else _combine(outcome, gathered)


def _gather(
    store: Any,
    group: dist.ProcessGroup | None,
    members: list[int],
    number: int,
    outcome: RankOutcome,
) -> list[RankOutcome] | Agreement:
    """Every member's outcome, or the zero agreement that names the ranks that missed the wait."""
    if store is None:  # no store to vote in: one collective, bounded by the group's timeout
        gathered: list[RankOutcome | None] = [None] * len(members)
        dist.all_gather_object(gathered, outcome, group=group)
        return [o for o in gathered if o is not None]
    votes = _exchange(store, members, number, outcome)
    late = [index for index, vote in enumerate(votes) if vote is None]
    if not late:
        return [vote for vote in votes if vote is not None]
    named = ", ".join(map(str, late[:8])) + (" ..." if len(late) > 8 else "")
    who = "this rank" if members.index(dist.get_rank()) in late else f"rank {named}"
    return Agreement(
        0,
        {index: "did not reach the agreement in time" for index in late},
        f"{who} did not reach the tensor-parallel agreement within "
        f"{AGREE_TIMEOUT_S:g} s of the others, so every rank credits 0; fix: pass "
        "every rank's runtime.process_group (the tensor-parallel group) and call "
        "before_first_capture on all ranks together",
    )


def _combine(outcome: RankOutcome, outcomes: list[RankOutcome]) -> Agreement:
    """The agreement every rank computes alike from the same outcomes."""
    fallback = {o.rank: o.reason or "reclaimed nothing" for o in outcomes if o.reclaimed_bytes == 0}
    first = outcomes[0]
    differing = [o for o in outcomes if o.settings_digest != first.settings_digest]
    if differing:
        detail = "; ".join(
            f"rank {o.rank}: {literal(o.settings, 200)}" for o in (first, differing[0])
        )
        if len(differing) > 1:
            detail += f"; and {len(differing) - 1} more ranks"
        fix = "give every rank one config"
        if any(o.settings.get("kv_sizing") != first.settings.get("kv_sizing") for o in differing):
            fix += " and one runtime.kv_sizing (the ranks size their KV caches alike)"
        return Agreement(0, fallback, f"plugin settings differ across ranks ({detail}); fix: {fix}")
    agreed = min(o.reclaimed_bytes for o in outcomes)
    reason: str | None = None
    if agreed < outcome.reclaimed_bytes or (agreed == 0 and fallback):
        listed = sorted(fallback.items())
        named = "; ".join(f"rank {r}: {shown(why, 300)}" for r, why in listed[:3])
        if len(listed) > 3:
            named += f"; and {len(listed) - 3} more ranks"
        reason = f"agreed across {len(outcomes)} ranks (minimum); " + (
            f"fell back: {named}" if named else "another rank saved less"
        )
    elif agreed == 0:
        reason = outcome.reason
    return Agreement(agreed, fallback, reason)


def _default_store() -> Any:
    """torch.distributed's default store (every rank's), or ``None`` where it cannot be had."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:
        return None


def _members(group: object) -> list[int] | None:
    """The group's ranks in the default group, in group order; ``None`` if it is no group."""
    try:
        return None if group is None else list(dist.get_process_group_ranks(group))  # type: ignore[arg-type]
    except Exception:
        return None


def _keys(members: list[int], number: int) -> list[str]:
    group = ",".join(map(str, members))
    return [f"{_PREFIX}/{group}/{number}/{rank}" for rank in members]


def _vote(store: Any, key: str, outcome: RankOutcome) -> None:
    store.compare_set(key, "", json.dumps(asdict(outcome)))


def _exchange(
    store: Any, members: list[int], number: int, outcome: RankOutcome
) -> list[RankOutcome | None]:
    """Every member's vote in group order, ``None`` for one that came too late (its own too)."""
    keys = _keys(members, number)
    _vote(store, keys[members.index(dist.get_rank())], outcome)
    try:
        store.wait(keys, timedelta(seconds=AGREE_TIMEOUT_S))
    except Exception:  # the wait ran out: the missing votes become "late", once, for everyone
        for key in keys:
            store.compare_set(key, "", _LATE)
    raws = [bytes(store.get(key)).decode("utf-8", "replace") for key in keys]
    return [None if raw == _LATE else RankOutcome(**json.loads(raw)) for raw in raws]
