"""The start-up's core, shared by hosts and programs: basis, choice, install, agree, report, offer.

A caller (:mod:`._startup` for hosts, :mod:`._evicting` for programs) checks its
inputs into a :class:`Request` and runs :func:`guarded`, whose one
``try``/``finally`` (pluggy's ``_multicall``) settles the start-up whatever was
raised. At most one credit is offered per installation. Under ``on_error =
"raise"`` every outcome that credits 0 raises one line (after the agreement, so
every rank raises), except ``enabled = false``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ._agree import Agreement, RankOutcome, agree, settings_digest
from ._b12x.proof import CreditBasis, measure_basis
from ._credit import Credit
from ._decision import choose_regions
from ._errors import L2EvictError, reason_of
from ._install import Installation
from ._lifecycle import PROCESS, Startup
from ._log import say
from ._report import ReclaimReport, Words
from ._runtime import Placement
from ._settings import DISABLED, L2EvictSettings
from ._weights import storages_of, weight_choice

log = logging.getLogger("flare_l2evict")


@dataclass
class Request:
    """What a caller checked: everything the core reads, and nothing of the caller's object.

    ``tensors`` is called once and its mapping dropped once the choice is
    installed. ``add`` ``None``: a program keeps the report.
    """

    device: torch.device
    l2_cache_bytes: int | None
    race_jobs: int
    tensors: Callable[[], Mapping[str, torch.Tensor]]
    add: Callable[[ReclaimReport], object] | None
    words: Words


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


def guarded(
    startup: Startup,
    body: Callable[[Clock], ReclaimReport],
    internal: Callable[[str], ReclaimReport],
) -> ReclaimReport:
    """Run ``body``; never raises an ``Exception`` but :class:`L2EvictError` (``on_error``).

    The one exit: whatever ``body`` did or raised, the start-up settles here.
    """
    report = startup.report
    escaped = True
    try:
        report = body(Clock())
        escaped = False
    except Exception as error:
        if issubclass(type(error), L2EvictError):
            raise  # on_error = "raise"
        report = internal(f"internal error in flare_l2evict ({reason_of(error)})")
        escaped = False
    finally:
        try:
            PROCESS.settle(startup, report or NO_REPORT, escaped)
        finally:  # idempotent: finishes a settling an asynchronous exception cut short
            PROCESS.settle(startup, report or NO_REPORT, escaped)
    return report


def start(
    startup: Startup, where: Placement, local: Local, request: Request | None, clock: Clock
) -> ReclaimReport:
    """This rank's credit, the agreement, the report, the offer (``request`` ``None``: refused)."""
    if request is not None and local.settings is not None:
        _prepare(request, local.settings, startup, local, clock)
    with clock.step("agree"):
        agreed = _agree(where, local.credit, local.settings)
    made = startup.installation
    current = PROCESS.current(startup)
    kept = made is not None and made.kept(agreed.reclaimed_bytes, current)
    if made is not None and not kept and local.credit.nbytes and agreed.reclaimed_bytes:
        agreed = Agreement(
            0, agreed.fallback_ranks, f"{made.words.ends} ran during the hook, or restore() did"
        )
    report = report_of(where, local, agreed, made if kept else None, clock.total())
    if made is None or not kept or request is None:
        return _fell_back(startup, report, local)
    return _offer(request, report, made, startup, local)


def _prepare(
    request: Request, settings: L2EvictSettings, startup: Startup, local: Local, clock: Clock
) -> None:
    """Basis, choice and installation: this rank's credit on ``local``, or why it is 0."""
    if not settings.enabled:
        local.credit = Credit(0, DISABLED)
        return
    try:
        with clock.step("seam"):
            basis = measure_basis(
                request.device, request.l2_cache_bytes, settings, request.race_jobs
            )
        local.basis = basis
        with clock.step("source"):
            found, held = storages_of(request.tensors(), request.device, request.words)
            choice = choose_regions(
                found,
                basis.window_bytes,
                settings.exclude,
                where=str(request.device),
                words=request.words,
            )
        if choice.shortfall is not None:
            local.credit = Credit(0, choice.shortfall)
            return
        with clock.step("install"):
            chosen = weight_choice(choice, held, request.device, request.words)
            del found, held, choice  # the caller's mapping: not kept past the install
            made = PROCESS.install(chosen, basis, request.words, startup=startup)
            del chosen
        local.credit = made.credit
        # Asked once the core holds no mapping: every other holder is then the caller's.
        if made.credit.nbytes and (unheld := made.unheld()) is not None:
            local.credit = Credit(0, f"{unheld}; fix: {request.words.resident}, not copies")
    except Exception as caught:
        local.error = caught
        local.credit = Credit(0, reason_of(caught))


def _offer(
    request: Request,
    report: ReclaimReport,
    installation: Installation,
    startup: Startup,
    local: Local,
) -> ReclaimReport:
    """Hand the report to the KV allocator, once; from here on the credit stays backed."""
    try:
        offered = installation.offer(request.add, report, lambda: PROCESS.current(startup))
    except BaseException as raised:
        report = report.model_copy(update={"allocator_error": installation.allocator_error})
        startup.report = report
        say(log, logging.WARNING, "flare_l2evict: %s", report.summary())
        if not issubclass(type(raised), Exception):
            raise
        if local.raising:
            raise L2EvictError(
                f"kv_allocator.add_reclaimed raised {report.allocator_error} and on_error = "
                "'raise'; the eviction stays installed until startup_complete, since the "
                "credit may have been applied"
            ) from raised
        return report
    if not offered:  # the start-up ended between the agreement and the offer
        report = report.model_copy(
            update={
                "reclaimed_bytes": 0,
                "mechanism": "none",
                "reason": (
                    f"{installation.words.ends} ran during {installation.words.began}, "
                    "or restore() did"
                ),
            }
        )
        return _fell_back(startup, report, local)
    startup.report = report
    say(log, logging.INFO, "flare_l2evict: %s", report.summary())
    return report


def _fell_back(startup: Startup, report: ReclaimReport, local: Local) -> ReclaimReport:
    """Stock b12x kept: one WARNING line; under ``on_error = "raise"`` the same line raised.

    ``enabled = false`` is the operator's choice, not a fault: its line is INFO.
    """
    startup.report = report
    disabled = local.settings is not None and not local.settings.enabled
    level = logging.INFO if disabled else logging.WARNING
    say(log, level, "flare_l2evict: stock b12x eviction kept; %s", report.summary())
    if local.raising and not disabled:
        raise L2EvictError(
            f"l2evict failed and on_error = 'raise': {report.reason}"
        ) from local.error
    return report


def _agree(where: Placement, local: Credit, settings: L2EvictSettings | None) -> Agreement:
    """Every rank reaches the agreement, faulted or not, so none waits forever."""
    if where.world_size == 1 and where.process_group is None:
        # One rank and no group (a program's evicting_from, a TP1 replica): nobody to agree
        # with, and no vote that another rank's agreement could mistake for its own.
        return Agreement(local.nbytes, {}, local.reason)
    digest, shown_settings = settings_digest(settings)
    try:
        return agree(
            RankOutcome(where.rank, local.nbytes, local.reason, digest, shown_settings),
            where.process_group,  # type: ignore[arg-type]
        )
    except Exception as caught:
        return Agreement(0, {}, f"tensor-parallel agreement failed ({reason_of(caught)})")


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
