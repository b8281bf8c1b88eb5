"""What one start-up step hands the next, and the reports made of it (no sequencing here)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._credit import Credit
from ._errors import L2EvictError
from ._log import say
from ._report import ReclaimReport
from ._runtime import Placement, placement, snapshot
from ._settings import L2EvictSettings
from ._text import described, shown

if TYPE_CHECKING:
    from ._agree import Agreement
    from ._b12x.proof import CreditBasis
    from ._install import Installation

log = logging.getLogger("flare_l2evict")

DISABLED = "disabled by config (enabled = false)"
"""The reason every report gives when the deployment turned the plugin off."""


class Clock:
    """Wall time per step of the hook, for the report (``ReclaimReport.seconds``)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

    def total(self) -> dict[str, float]:
        return {**self.seconds, "total": time.perf_counter() - self.started}


@dataclass
class Local:
    """What this rank brings to the agreement: its settings, basis and credit.

    ``settings`` ``None``: they could not be read; ``raising``: the deployment asked
    for ``on_error = "raise"`` (read even from an invalid section); ``error``: the
    fault that made the credit 0.
    """

    settings: L2EvictSettings | None = None
    raising: bool = False
    basis: CreditBasis | None = None
    credit: Credit = field(default_factory=lambda: Credit(0, "not started"))
    error: Exception | None = None


NO_REPORT = ReclaimReport(
    device="unknown", reclaimed_bytes=0, mechanism="none", reason="the hook did not finish"
)


def nothing(runtime: object, reason: str) -> ReclaimReport:
    """A report of 0 bytes for a call that changed nothing, logged as one WARNING line."""
    where = placement(snapshot(runtime))
    report = ReclaimReport(
        device=where.device,
        rank=where.rank,
        world_size=where.world_size,
        reclaimed_bytes=0,
        mechanism="none",
        reason=reason,
    )
    say(log, logging.WARNING, "flare_l2evict: this call changed nothing; %s", report.summary())
    return report


def report_of(
    where: Placement,
    local: Local,
    agreed: Agreement,
    installation: Installation | None,
    seconds: dict[str, float],
) -> ReclaimReport:
    basis = local.basis
    figures: dict[str, Any] = {} if basis is None else {
        "window_bytes": basis.window_bytes,
        "stock_buffer_bytes": basis.stock.nbytes,
        "race_jobs": basis.race_jobs,
    }  # fmt: skip
    source: dict[str, Any] = {}
    if installation is not None:
        source = {
            "source_tensor": installation.source_name,
            "source_storage_bytes": sum(read.storage_bytes for read in installation.sources),
            "sources": installation.sources,
            "read_kernel": installation.read_kernel,
        }
    credited = agreed.reclaimed_bytes if installation is not None else 0
    return ReclaimReport(
        device=where.device,
        rank=where.rank,
        world_size=where.world_size,
        reclaimed_bytes=credited,
        local_reclaimed_bytes=local.credit.nbytes,
        mechanism=installation.mechanism if installation is not None else "none",
        reason=agreed.reason or (None if credited else local.credit.reason),
        fallback_ranks=agreed.fallback_ranks,
        seconds={name: round(value, 6) for name, value in seconds.items()},
        **figures,
        **source,
    )


def reason_of(error: BaseException) -> str:
    """One line: our own errors as they are, anything else with its type; never raises."""
    if issubclass(type(error), L2EvictError):
        return shown(" ".join(str(error).split()), 500)
    return described(error, 500)
