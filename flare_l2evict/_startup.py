"""One start-up, end to end: read the host, decide, install, agree, offer the credit, audit.

:class:`L2EvictStartup` owns the start-up's state and is the only code that
changes it. Its invariants, which the KV allocator relies on:

* one ``before_first_capture`` at a time per process: a call made while a
  start-up is in progress or done (re-entrant from the allocator, from another
  thread, or repeated) credits 0 and touches nothing;
* at most one credit is offered per installation, across all allocators;
* from the moment ``add_reclaimed`` is called, the installation stays until
  :meth:`L2EvictStartup.finish` (``startup_complete``), whatever the allocator
  does: a credit without its eviction would run the server out of memory;
* before the offer, any exception (``BaseException`` included) leaves nothing
  installed; ``KeyboardInterrupt`` and ``SystemExit`` still propagate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ._agree import Agreement, RankOutcome, agree, settings_digest
from ._credit import Credit, credit
from ._decision import Decision, decide
from ._errors import L2EvictError
from ._install import Installation, active_installation, install, restore
from ._log import say
from ._report import ReclaimReport, SourceRead, StartupAudit
from ._runtime import (
    Placement,
    RuntimeFacts,
    Snapshot,
    placement,
    read_runtime,
    read_tensors,
    snapshot,
)
from ._seam import SeamProof, StockBuffer, fork_function, measure_stock_buffer, prove_seam
from ._settings import L2EvictSettings, read_section, settings_from_section, wants_raise
from ._source import source_choice, storages_of
from ._text import described, shown
from ._window import WORD, device_l2_bytes, stock_buffer_bytes

log = logging.getLogger("flare_l2evict")


@dataclass(frozen=True)
class Sizes:
    """The byte figures of this device that the credit rests on, and the seam they came from.

    ``stock`` is measured once, through the proven seam on CUDA, and used by
    both the credit and the installation. ``proof`` is ``None`` only when the
    fork's API is used (its buffer is the formula).
    """

    l2_cache_bytes: int
    window_bytes: int
    stock: StockBuffer
    race_jobs: int
    proof: SeamProof | None


class _Clock:
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


def measure_sizes(facts: RuntimeFacts, settings: L2EvictSettings, clock: _Clock) -> Sizes:
    """L2, window and stock's real per-job buffer on ``facts.device``.

    On CUDA stock's buffer is measured through the proven seam (allocated
    once, then freed); elsewhere it is the formula. Raises
    :class:`~flare_l2evict.InstallError` when b12x fails the proof and the
    fork's API is absent.
    """
    l2 = facts.l2_cache_bytes
    if l2 is None:
        l2 = device_l2_bytes(facts.device)
    window = settings.window_bytes(l2)
    with clock.step("seam"):
        fork = fork_function()
        proof = None if fork is not None else prove_seam()
    if proof is None:
        return Sizes(l2, window, StockBuffer(stock_buffer_bytes(l2), False), facts.race_jobs, None)
    with clock.step("stock_buffer"):
        stock = measure_stock_buffer(proof.original, facts.device, l2)
    return Sizes(l2, window, stock, facts.race_jobs, proof)


def _decide_and_install(
    facts: RuntimeFacts, settings: L2EvictSettings, sizes: Sizes, clock: _Clock, state: _State
) -> tuple[Decision, Installation | None]:
    """The decision on this rank's tensors, and the installation when it credits anything.

    Invariants: when the decision's credit is 0, nothing is installed; an
    installation made here is recorded on ``state`` at once (the start-up owns
    it, and only it).
    """
    with clock.step("source"):
        tensors = read_tensors(facts)
        storages, held = storages_of(tensors, facts.device)
        decision = decide(
            storages,
            window_bytes=sizes.window_bytes,
            exclude=settings.exclude,
            race_jobs=sizes.race_jobs,
            stock_buffer_bytes=sizes.stock.nbytes,
            where=str(facts.device),
        )
    if decision.credit.nbytes == 0:
        return decision, None
    with clock.step("install"):
        choice = source_choice(decision.choice, held, facts.device)
        installation = install(choice, sizes.proof, sizes.stock)  # refuses if one is active
        state.installation = installation
    return decision, installation


@dataclass
class _State:
    """The start-up in progress or done: who runs it, what it installed and reported.

    ``offering`` is true while the credit is being handed to the allocator; a
    ``startup_complete`` that lands then sets ``finished`` and leaves the restore
    to the offering thread, once ``add_reclaimed`` has returned.
    """

    thread: int
    installation: Installation | None = None
    report: ReclaimReport | None = None
    offering: bool = False
    finished: bool = False


class L2EvictStartup:
    """The plugin's start-up in this process (see the module docstring for its invariants).

    :meth:`run` never raises an ``Exception`` unless the deployment asked for
    ``on_error = "raise"`` (and then only after restoring stock b12x, or, once
    the credit was offered, keeping the eviction it backs); on any fault it
    restores stock b12x and reports 0 with the reason, whatever the host passed.
    It restores only the installation it made itself.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held only for state changes, never across host code
        self._state: _State | None = None

    def run(self, runtime: object) -> ReclaimReport:
        with self._lock:
            busy = self._state
            if busy is None:
                state = self._state = _State(threading.get_ident())
        if busy is not None:
            return self._refused(runtime, busy)
        try:
            return self._run(runtime, state)
        except BaseException as error:
            # Whatever escaped, the state says the start-up ran, so startup_complete still
            # audits; this start-up's installation stays only if its credit was offered.
            mine = state.installation
            if mine is not None and mine.offered_bytes == 0:
                mine.restore()
            self._settle(state, None)
            if issubclass(type(error), L2EvictError) or not issubclass(type(error), Exception):
                raise  # on_error = "raise", KeyboardInterrupt, SystemExit
            return _nothing(runtime, f"internal error in flare_l2evict ({_reason(error)})")

    def _refused(self, runtime: object, busy: _State) -> ReclaimReport:
        installation = active_installation()
        if busy.thread == threading.get_ident() and busy.report is None:
            how = "re-entrant call (from inside this start-up's own hook, e.g. its KV allocator)"
        elif busy.report is None:
            how = "concurrent call (another thread is running before_first_capture)"
        else:
            how = "repeated call (before_first_capture already ran in this start-up)"
        active = repr(installation) if installation is not None else "no installation"
        reason = (
            f"{how} while a start-up is active ({shown(active, 300)}); this call credits 0 and "
            "changes nothing; fix: call before_first_capture once per start-up, and "
            "startup_complete before starting again"
        )
        return _nothing(runtime, reason)

    def _run(self, runtime: object, state: _State) -> ReclaimReport:
        clock = _Clock()
        with clock.step("runtime"):
            seen = snapshot(runtime)
            where = placement(seen)
        settings: L2EvictSettings | None = None
        sizes: Sizes | None = None
        installation: Installation | None = None
        local = Credit(0, "not started")
        error: Exception | None = None
        raising = False
        try:
            config = seen.get("config")
            with clock.step("settings"):
                # Settings first, so on_error = "raise" also covers the runtime's faults;
                # the section is read once, so both see the same values. A config that
                # is no mapping at all is the runtime's fault, named below.
                if config is None or isinstance(config, Mapping):
                    section = read_section(config)
                    raising = wants_raise(section)
                    settings = settings_from_section(section)
                    raising = settings.on_error == "raise"
            with clock.step("runtime"):
                facts = read_runtime(seen)
            assert settings is not None  # read_runtime refused a config that is no mapping
            if not settings.enabled:
                local = Credit(0, "disabled by config (enabled = false)")
            else:
                sizes = measure_sizes(facts, settings, clock)
                decision, installation = _decide_and_install(facts, settings, sizes, clock, state)
                # An installation's credit is held to what it really reads.
                local = decision.credit if installation is None else _credit_of(installation, sizes)
        except Exception as caught:
            if state.installation is not None:
                state.installation.restore()
            installation, error = None, caught
            local = Credit(0, _reason(caught))
        except BaseException:
            if state.installation is not None:
                state.installation.restore()
            raise
        with clock.step("agree"):
            agreed = self._agree(where, local, settings)
        if agreed.reclaimed_bytes == 0 and installation is not None:
            installation.restore()  # ranks race alike: if nothing is credited, nobody reads weights
            installation = None
        if installation is not None and not self._claim_offer(state):
            installation.restore()
            installation = None
            agreed = Agreement(
                0, agreed.fallback_ranks, "startup_complete ran during before_first_capture"
            )
        report = _report(where, local, agreed, sizes, installation, clock.total())
        if error is not None and raising:
            self._settle(state, report)
            say(
                log,
                logging.WARNING,
                "flare_l2evict: stock b12x eviction kept; %s",
                report.summary(),
            )
            raise L2EvictError(f"l2evict failed and on_error = 'raise': {report.reason}") from error
        return self._offer(seen, report, installation, state, raising)

    def _offer(
        self,
        seen: Snapshot,
        report: ReclaimReport,
        installation: Installation | None,
        state: _State,
        raising: bool,
    ) -> ReclaimReport:
        """Hand the report to the KV allocator, once; from here on the credit stays backed."""
        add = seen.add_reclaimed
        offered = report.reclaimed_bytes if installation is not None else 0
        if installation is not None:
            installation.record_offer(
                offered, race_jobs=report.race_jobs, stock_buffer_bytes=report.stock_buffer_bytes
            )
        raised: BaseException | None = None
        try:
            if add is not None:
                add(report)
        except BaseException as caught:  # the allocator may have applied it before raising
            raised = caught
        finally:
            self._end_offer(state, installation)
        if raised is not None:
            text = _reason(raised)
            if installation is not None:
                installation.record_offer(
                    offered,
                    race_jobs=report.race_jobs,
                    stock_buffer_bytes=report.stock_buffer_bytes,
                    allocator_error=text,
                )
            report = report.model_copy(update={"allocator_error": text})
        self._settle(state, report)
        if report.reclaimed_bytes:
            level = logging.WARNING if raised is not None else logging.INFO
            say(log, level, "flare_l2evict: %s", report.summary())
        else:
            detail = f" (kv_allocator.add_reclaimed raised {report.allocator_error})"
            say(
                log,
                logging.WARNING,
                "flare_l2evict: stock b12x eviction kept; %s%s",
                report.summary(),
                detail if raised is not None else "",
            )
        if raised is not None and not issubclass(type(raised), Exception):
            raise raised
        if raised is not None and raising:
            raise L2EvictError(
                f"kv_allocator.add_reclaimed raised {report.allocator_error} and on_error = "
                "'raise'; the eviction stays installed until startup_complete, since the "
                "credit may have been applied"
            ) from raised
        return report

    def _claim_offer(self, state: _State) -> bool:
        """Whether this start-up is still the current one; if so, its offer begins.

        Under the lock: a ``startup_complete`` either came before (no offer,
        nothing stays installed) or comes during or after the offer (it ends the
        start-up, and the restore waits for ``add_reclaimed`` to return).
        """
        with self._lock:
            if self._state is not state:
                return False
            state.offering = True
            return True

    def _end_offer(self, state: _State, installation: Installation | None) -> None:
        with self._lock:
            state.offering = False
            finished = state.finished
        if finished and installation is not None:
            installation.restore()  # startup_complete came during the offer; it is over now

    def _settle(self, state: _State, report: ReclaimReport | None) -> None:
        """Record the start-up as done, with its report."""
        with self._lock:
            state.report = report or state.report or _NO_REPORT

    def _agree(
        self, where: Placement, local: Credit, settings: L2EvictSettings | None
    ) -> Agreement:
        """Every rank reaches the agreement, faulted or not, so none waits forever."""
        digest, shown_settings = settings_digest(settings)
        try:
            return agree(
                RankOutcome(where.rank, local.nbytes, local.reason, digest, shown_settings),
                where.process_group,  # type: ignore[arg-type]
            )
        except Exception as caught:
            return Agreement(0, {}, f"tensor-parallel agreement failed ({_reason(caught)})")

    def finish(self) -> StartupAudit:
        """Start-up is over: audit, stock b12x back, no reference to the weights.

        Never raises an ``Exception``: it is the host's last start-up step.
        """
        with self._lock:
            state, self._state = self._state, None
            deferred = state is not None and state.offering
            if state is not None:
                state.finished = True
        installation = active_installation()
        try:
            audit = StartupAudit(mechanism="none") if installation is None else installation.audit()
        except Exception as error:
            audit = StartupAudit(mechanism="none", device=f"audit failed: {_reason(error)}")
        if not deferred:
            restore()
        if state is not None or installation is not None:
            level = logging.WARNING if audit.warns else logging.INFO
            say(log, level, "flare_l2evict: audit: %s", audit.summary())
        return audit


def _credit_of(installation: Installation, sizes: Sizes) -> Credit:
    """The decision's credit, held to what was really installed."""
    return credit(
        installable=not installation.restored,
        race_jobs=sizes.race_jobs,
        stock_buffer_bytes=sizes.stock.nbytes,
        window_bytes=sizes.window_bytes // WORD * WORD,
        read_bytes=installation.read_bytes,
    )


_NO_REPORT = ReclaimReport(
    device="unknown", reclaimed_bytes=0, mechanism="none", reason="the hook did not finish"
)


def _nothing(runtime: object, reason: str) -> ReclaimReport:
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


def _report(
    where: Placement,
    local: Credit,
    agreed: Agreement,
    sizes: Sizes | None,
    installation: Installation | None,
    seconds: dict[str, float],
) -> ReclaimReport:
    figures: dict[str, Any] = {} if sizes is None else {
        "window_bytes": sizes.window_bytes,
        "stock_buffer_bytes": sizes.stock.nbytes,
        "race_jobs": sizes.race_jobs,
    }  # fmt: skip
    source: dict[str, Any] = {}
    if installation is not None:
        sources: tuple[SourceRead, ...] = installation.sources
        source = {
            "source_tensor": installation.source_name,
            "source_storage_bytes": sum(read.storage_bytes for read in sources),
            "sources": sources,
            "read_kernel": installation.read_kernel,
        }
    credited = agreed.reclaimed_bytes if installation is not None else 0
    return ReclaimReport(
        device=where.device,
        rank=where.rank,
        world_size=where.world_size,
        reclaimed_bytes=credited,
        local_reclaimed_bytes=local.nbytes,
        mechanism=installation.mechanism if installation is not None else "none",
        reason=agreed.reason or (None if credited else local.reason),
        fallback_ranks=agreed.fallback_ranks,
        seconds={name: round(value, 6) for name, value in seconds.items()},
        **figures,
        **source,
    )


def _reason(error: BaseException) -> str:
    """One line: our own errors as they are, anything else with its type; never raises."""
    if issubclass(type(error), L2EvictError):
        return shown(" ".join(str(error).split()), 500)
    return described(error, 500)
