"""``plan``'s and ``check``'s decision: start-up's choice and start-up's credit, together.

:func:`decide` is :func:`~flare_l2evict._decision.choose_regions` followed by
:func:`~flare_l2evict._credit.credit`, from what a caller knows.

Tools-side: a server's start-up calls the same two functions itself, so what the
tools print is what start-up does (``tests/test_plan_matches_startup.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._credit import Credit, credit
from .._decision import Region, RegionChoice, Storages, choose_regions


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

    ``blocked`` is why nothing can be installed whatever the storages (b12x's
    seam failed its proof, the plugin is disabled), or ``None``. The credit is
    :func:`~flare_l2evict.credit` of the choice; its reason, when it is 0, is
    the first of: ``blocked``, the choice's shortfall, the credit's own.
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
    )
    return Decision(choice, granted)
