"""Tensor-parallel agreement: every rank hands the KV allocator the same figure."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
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


def settings_digest(settings: L2EvictSettings | None) -> tuple[str, dict[str, Any]]:
    """A short digest of the settings, so ranks can tell they were configured alike."""
    dumped = {} if settings is None else settings.model_dump(mode="json")
    text = json.dumps(dumped, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12], dumped


def agree(
    outcome: RankOutcome,
    group: dist.ProcessGroup | None,
) -> Agreement:
    """The minimum reclaimed bytes over the ranks of ``group``.

    Every rank must call this exactly once per start-up, whatever happened to
    it before, so that nobody waits on a rank that gave up: callers reach it
    with a zero outcome after a fault rather than skipping it. One collective
    (``all_gather_object``) carries each rank's figure, reason and settings
    digest; the minimum is taken locally and is identical everywhere. Ranks
    whose settings differ make the agreed figure 0 and are named. Without a
    group (or a group of one), the rank's own figure stands.
    """
    if group is None or not dist.is_available() or not dist.is_initialized():
        return Agreement(outcome.reclaimed_bytes, {}, outcome.reason)
    if dist.get_world_size(group) == 1:
        return Agreement(outcome.reclaimed_bytes, {}, outcome.reason)
    gathered: list[RankOutcome | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, outcome, group=group)
    outcomes = [o for o in gathered if o is not None]
    fallback = {o.rank: o.reason or "reclaimed nothing" for o in outcomes if o.reclaimed_bytes == 0}
    digests = {o.settings_digest for o in outcomes}
    if len(digests) > 1:
        first = outcomes[0]
        differing = [o for o in outcomes if o.settings_digest != first.settings_digest]
        shown_ranks = [first, differing[0]]
        detail = "; ".join(f"rank {o.rank}: {literal(o.settings, 200)}" for o in shown_ranks)
        if len(differing) > 1:
            detail += f"; and {len(differing) - 1} more ranks"
        return Agreement(
            0,
            fallback,
            f"plugin settings differ across ranks ({detail}); fix: give every rank one config",
        )
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
