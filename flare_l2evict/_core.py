"""Run one start-up, from a checked request to the report: the core both adapters call.

:func:`start` takes a :class:`~._request.Request` (or the :class:`Refused` one a
caller's bad input makes, which still takes its turn in the tensor-parallel
agreement), begins the process's :class:`~._startup.Startup`, and walks the
passive parts downward: basis, choice, eviction, seam, credit, agreement,
report, offer. Its one ``finally`` hands the start-up back first (:meth:`Startup.leave`),
which keeps the install if and only if the offer began. :func:`faulted` is the
one place that decides what a fault becomes. :meth:`Startup.end` is ``startup_complete``.
Nothing here holds the process lock: :class:`~._startup.Startup` takes it per transition.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

from ._agree import Agreement, RankOutcome, agree, settings_digest
from ._b12x.proof import CreditBasis, measure_basis
from ._b12x.seam import Mechanism, seam_for
from ._clock import Clock
from ._credit import WORD, Credit, credit
from ._decision import choose_regions
from ._errors import FallbackError, RuntimeContractError, reason_of
from ._eviction import WeightEviction
from ._log import say
from ._report import ReclaimReport, RegionRead, TritonReport
from ._request import KVSizing, Placement, Refused, Request
from ._settings import DISABLED
from ._startup import Busy, Startup
from ._triton.wing import TritonWing, triton_wing
from ._weights import WeightChoice, storages_of, weight_choice

log = logging.getLogger("flare_l2evict")


@dataclass
class RankCredit:
    """What this rank brings to the agreement: its credit (or why it is 0) and what backs it."""

    credit: Credit
    basis: CreditBasis | None = None
    error: Exception | None = None
    eviction: WeightEviction | None = None
    sources: tuple[RegionRead, ...] = field(default=())
    mechanism: Mechanism = "stock-seam"
    triton: TritonWing | None = None
    """Triton's side of the install, once b12x's went ahead (``None``: never reached)."""


def start(request: Request | Refused) -> ReclaimReport:
    """One start-up for ``request``; never raises an ``Exception`` but :func:`faulted`'s
    :class:`FallbackError` under ``on_error = "raise"``."""
    token = object()  # how leave() finds this start-up, whatever cut the code below short
    report: ReclaimReport | None = None
    escaped = True
    try:
        began = Startup.begin(request.owner, token, request.wording)
        if isinstance(began, Busy):
            report = _busy(request, began)
        else:
            report = _run(began, request, Clock())
        escaped = False
    except FallbackError:
        raise  # on_error = "raise": faulted's own, after the start-up was decided
    except Exception as error:
        reason = f"internal error in flare_l2evict ({reason_of(error)})"
        report = faulted(_zero(request.placement, reason), raising=request.raising, cause=error)
        escaped = False
    finally:
        # First: an interrupt at any later line of this block must not leave the start-up
        # unsettled (installed, its slot taken, every retry refused as re-entrant).
        Startup.leave(token, report, escaped)
        if isinstance(request, Request):  # not taken (a fault came first): not held past here,
            request.take_tensors()  # whatever frame an exception's traceback keeps alive
    return report


def faulted(
    report: ReclaimReport,
    *,
    raising: bool,
    disabled: bool = False,
    cause: BaseException | None = None,
) -> ReclaimReport:
    """What a fault becomes: the one place that decides it, for every caller.

    * ``disabled`` (``enabled = false``): the operator's choice, not a fault: one INFO line,
      never a raise;
    * a credit that stands (``report.reclaimed_bytes``: the allocator raised after the offer):
      its WARNING line is logged whatever follows, since the host may have applied it;
    * a ``cause`` that is no ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) is the host's:
      raised again;
    * ``raising`` (``on_error = "raise"``): one :class:`FallbackError` (an
      :class:`L2EvictError`) naming the reason (when nothing stands, not logged as well: the
      host logs or prints the raise);
    * otherwise: one WARNING line (stock b12x kept) and the report.
    """
    if disabled:
        say(log, logging.INFO, "flare_l2evict: stock b12x eviction kept; %s", report.summary())
        return report
    stands = report.reclaimed_bytes > 0
    if stands:
        say(log, logging.WARNING, "flare_l2evict: %s", report.summary())
    elif not raising:
        say(log, logging.WARNING, "flare_l2evict: stock b12x eviction kept; %s", report.summary())
    if cause is not None and not issubclass(type(cause), Exception):
        raise cause
    if raising and stands:
        raise FallbackError(
            f"kv_allocator.add_reclaimed raised {report.allocator_error} and on_error = "
            "'raise'; the eviction stays installed until startup_complete, since the "
            "credit may have been applied"
        ) from cause
    if raising:
        raise FallbackError(f"l2evict failed and on_error = 'raise': {report.reason}") from cause
    return report


def _zero(placement: Placement, reason: str) -> ReclaimReport:
    return ReclaimReport(
        device=placement.device,
        rank=placement.rank,
        world_size=placement.world_size,
        reclaimed_bytes=0,
        mechanism="none",
        reason=reason,
    )


def _busy(request: Request | Refused, busy: Busy) -> ReclaimReport:
    reason = request.wording.busy.format(how=busy.how, active=busy.active)
    return faulted(_zero(request.placement, reason), raising=request.raising)


def _run(startup: Startup, request: Request | Refused, clock: Clock) -> ReclaimReport:
    """This rank's credit, the agreement, the report, the offer."""
    if isinstance(request, Refused):
        mine = RankCredit(Credit(0, reason_of(request.error)), error=request.error)
    else:
        mine = _prepare(startup, request, clock)
    report = _settled(startup, request, mine, clock)
    if mine.triton is not None:  # beside the line above, once its outcome is known
        mine.triton.say(report.triton)
    return report


def _settled(
    startup: Startup, request: Request | Refused, mine: RankCredit, clock: Clock
) -> ReclaimReport:
    """The agreement, the report and the offer (or the fault), for this rank's credit."""
    with clock.step("agree"):
        agreed = _agree(startup, request, mine.credit)
    kept = mine.eviction is not None and agreed.reclaimed_bytes > 0
    if kept and not startup.awaits_offer():
        kept = False
        agreed = Agreement(
            0,
            agreed.fallback_ranks,
            f"{request.wording.ends} ran during the hook, or restore() did",
        )
    report = _report_of(request.placement, mine, agreed, kept, clock.total(), request.kv_sizing)
    disabled = request.settings is not None and not request.settings.enabled
    if not kept or isinstance(request, Refused):
        return faulted(report, raising=request.raising, disabled=disabled, cause=mine.error)
    if request.kv_sizing == "measured":
        return _kept_for_measurement(startup, request, report)
    return _offer(startup, request, report)


def _kept_for_measurement(
    startup: Startup, request: Request, report: ReclaimReport
) -> ReclaimReport:
    """A host that sizes its KV cache from measured memory: the eviction stays installed and
    nothing is credited, since its measurement already sees the bytes the races keep free."""
    unallocated = report.reclaimed_bytes
    measured = report.model_copy(
        update={
            "reclaimed_bytes": 0,
            "unallocated_bytes": unallocated,
            "reason": (
                f"credited nothing: the host sizes its KV cache by measurement (runtime.kv_sizing "
                f"= 'measured'), which already sees the {unallocated:,} bytes the races no longer "
                "allocate; crediting them too would count them twice"
            ),
        }
    )
    if not startup.keep():  # the start-up ended, or restore() ran, since the agreement
        return _ended_meanwhile(request, report)
    say(log, logging.INFO, "flare_l2evict: %s", measured.summary())
    return measured


def _prepare(startup: Startup, request: Request, clock: Clock) -> RankCredit:
    """Basis, choice, eviction and install: this rank's credit, or why it is 0."""
    if not request.settings.enabled:
        return RankCredit(Credit(0, DISABLED))
    basis: CreditBasis | None = None
    try:
        with clock.step("seam"):
            basis = measure_basis(
                request.device, request.l2_cache_bytes, request.settings, request.race_jobs
            )
        if request.race_jobs == 0:  # a model that races nothing: no buffer to give back
            fix = request.wording.race_jobs.format("the b12x race jobs held at once")
            return RankCredit(Credit(0, f"nothing to reclaim: 0 race jobs; fix: {fix}"), basis)
        with clock.step("source"):
            chosen = _chosen(request, basis.window_bytes)
        if isinstance(chosen, str):
            return RankCredit(Credit(0, chosen), basis)
        with clock.step("install"):
            sources = tuple(
                RegionRead(
                    tensor=r.name,
                    storage_bytes=r.nbytes,
                    read_bytes=sum(p.nbytes for p in r.pieces),
                )
                for r in chosen.regions
            )
            seam = seam_for(basis)
            eviction = WeightEviction(
                chosen, fallback=seam.fallback(chosen.device), until=request.wording.ends
            )
            del chosen
            mine = _credit_of(basis, eviction, request.kv_sizing)
            triton = triton_wing(eviction.device, basis.l2_cache_bytes, request.settings.triton)
            startup.install(seam, eviction, (triton,))
        # Asked once the core holds no mapping: every other holder is then the caller's.
        if mine.nbytes and (unheld := startup.unheld()) is not None:
            mine = Credit(0, f"{unheld}; fix: {request.wording.resident}, not copies")
        kept = eviction if mine.nbytes else None
        return RankCredit(mine, basis, None, kept, sources, seam.mechanism, triton)
    except Exception as caught:
        # Its traceback holds this frame, and through it the weights: not kept past here.
        return RankCredit(Credit(0, reason_of(caught)), basis, caught.with_traceback(None))


def _chosen(request: Request, window_bytes: int) -> WeightChoice | str:
    """The weights to read, or the shortfall line; the caller's mapping is dropped on return."""
    tensors = request.take_tensors()
    if tensors is None:  # an enabled request always carries the mapping
        raise RuntimeContractError(f"no tensors were handed; fix: {request.wording.loaded}")
    found, held = storages_of(tensors, request.device, request.wording)
    del tensors
    choice = choose_regions(
        found,
        window_bytes,
        request.settings.exclude,
        where=str(request.device),
        words=request.wording,
    )
    if choice.shortfall is not None:
        return choice.shortfall
    return weight_choice(choice, held, request.device, request.wording)


def _credit_of(basis: CreditBasis, eviction: WeightEviction, kv_sizing: KVSizing) -> Credit:
    """The credit, bounded by the memory free on the device. A measuring host takes no credit,
    so that bound is not its: the figure says what the races no longer allocate, and it
    decides, as for any host, only whether the install is worth keeping."""
    return credit(
        installable=True,
        race_jobs=basis.race_jobs,
        stock_buffer_bytes=basis.stock.nbytes,
        window_bytes=basis.window_bytes // WORD * WORD,
        read_bytes=eviction.read_bytes,
        free_bytes=None if kv_sizing == "measured" else basis.free_bytes,
    )


def _agree(startup: Startup, request: Request | Refused, mine: Credit) -> Agreement:
    """Every rank reaches the agreement, faulted or not, so none waits forever."""
    placement = request.placement
    if placement.world_size == 1 and placement.process_group is None:
        # One rank and no group (a program's block, a TP1 replica): nobody to agree
        # with, and no vote that another rank's agreement could mistake for its own.
        return Agreement(mine.nbytes, {}, mine.reason)
    digest, settings = settings_digest(request.settings, request.kv_sizing)
    try:
        return agree(
            RankOutcome(placement.rank, mine.nbytes, mine.reason, digest, settings),
            placement.process_group,  # type: ignore[arg-type]
            startup.agreement_round(),
        )
    except Exception as caught:
        return Agreement(0, {}, f"tensor-parallel agreement failed ({reason_of(caught)})")


def _report_of(
    placement: Placement,
    mine: RankCredit,
    agreed: Agreement,
    kept: bool,
    seconds: dict[str, float],
    kv_sizing: KVSizing,
) -> ReclaimReport:
    basis, eviction = mine.basis, mine.eviction
    figures: dict[str, Any] = {} if basis is None else {
        "window_bytes": basis.window_bytes,
        "stock_buffer_bytes": basis.stock.nbytes,
        "race_jobs": basis.race_jobs,
        "device_free_bytes": basis.free_bytes,
        "uncut_credit_bytes": mine.credit.uncut_bytes,
    }  # fmt: skip
    source: dict[str, Any] = {}
    if kept and eviction is not None and basis is not None:
        source = {
            "source_tensor": eviction.source_name,
            "source_storage_bytes": sum(read.storage_bytes for read in mine.sources),
            "sources": mine.sources,
            "read_kernel": eviction.kernel,
        }
    credited = agreed.reclaimed_bytes if kept else 0
    triton = mine.triton.report() if mine.triton is not None else TritonReport()
    return ReclaimReport(
        device=placement.device,
        rank=placement.rank,
        world_size=placement.world_size,
        reclaimed_bytes=credited,
        local_reclaimed_bytes=mine.credit.nbytes,
        mechanism=mine.mechanism if source else "none",
        reason=agreed.reason or (None if credited else mine.credit.reason),
        kv_sizing=kv_sizing,
        fallback_ranks=agreed.fallback_ranks,
        seconds={name: round(value, 6) for name, value in seconds.items()},
        triton=triton if kept else triton.stock(),
        **figures,
        **source,
    )


def _offer(startup: Startup, request: Request, report: ReclaimReport) -> ReclaimReport:
    """Hand the report to the KV allocator, once; from here on the credit stays backed."""
    if not startup.offer(report):  # the start-up ended, or restore() ran, since the agreement
        return _ended_meanwhile(request, report)
    raised: BaseException | None = None
    ended = late = False
    try:
        late = startup.ending()  # ended since the offer, before the allocator was called
        if request.add is not None:
            _check_returned(request.add(report))
    except BaseException as error:
        raised = error
    finally:
        ended = startup.offered(raised)
    if raised is None and ended:
        say(
            log,
            logging.WARNING,
            "flare_l2evict: %s",
            _ended_during_the_offer(request, report, late),
        )
        return report
    if raised is None:
        cut = report.uncut_credit_bytes is not None  # the line says so: a WARNING
        say(log, logging.WARNING if cut else logging.INFO, "flare_l2evict: %s", report.summary())
        return report
    report = report.model_copy(update={"allocator_error": startup.allocator_error})
    return faulted(report, raising=request.raising, cause=raised)


def _ended_during_the_offer(request: Request, report: ReclaimReport, late: bool) -> str:
    """The line for an offer inside which the start-up ended: no "reclaimed" for a start-up
    that is gone (its audit, logged by that end, came first). ``late``: the end came before the
    allocator was called (another thread, a signal handler), not inside its call."""
    words = request.wording
    if late:
        when = (
            "ran after the credit was recorded but before kv_allocator.add_reclaimed was "
            "called (on another thread, or in a signal handler)"
        )
        fix = f"call {words.ends} after the last race, once {words.began} has returned"
    else:
        when = "ran inside kv_allocator.add_reclaimed, before it returned"
        fix = f"call {words.ends} after the last race, never from add_reclaimed"
    return (
        f"the start-up ended during the offer: {words.ends} {when}, so stock b12x is back and "
        f"the audit above is this start-up's last; the allocator was offered "
        f"{report.reclaimed_bytes:,} bytes on {report.device} (rank {report.rank}); fix: {fix}"
    )


def _ended_meanwhile(request: Request, report: ReclaimReport) -> ReclaimReport:
    """The start-up ended, or restore() ran, between the agreement and the offer: 0 bytes."""
    reason = f"{request.wording.ends} ran during {request.wording.began}, or restore() did"
    zero = report.model_copy(
        update={
            "reclaimed_bytes": 0,
            "mechanism": "none",
            "reason": reason,
            "triton": report.triton.stock(),
        }
    )
    return faulted(zero, raising=request.raising)


def _check_returned(returned: object) -> None:
    """Raise if ``add_reclaimed`` returned an awaitable or a generator: its work has not run,
    may never run."""
    lazy = inspect.isgenerator(returned) or inspect.isasyncgen(returned)
    if not (lazy or inspect.isawaitable(returned)):
        return
    if inspect.iscoroutine(returned) or inspect.isgenerator(returned):
        returned.close()
    what = "a generator" if lazy else "an awaitable"
    raise RuntimeContractError(
        f"kv_allocator.add_reclaimed returned {type(returned).__name__} ({what}): the "
        "credit may not have been applied; fix: make add_reclaimed a plain function that grows "
        "the KV budget before returning"
    )
