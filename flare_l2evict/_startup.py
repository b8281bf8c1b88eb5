"""One start-up, in order: read the host, size, choose, install, agree, offer, audit.

Sequencing only: each step is a function of its own module, and the state
between calls lives in :data:`~._lifecycle.PROCESS`. The promises the KV
allocator relies on:

* one ``before_first_capture`` at a time per process: a call made while a
  start-up is in progress or done (re-entrant from the allocator, from another
  thread, a second model, or repeated) credits 0 and touches nothing;
* at most one credit is offered per installation, across all allocators;
* from the offer on, the installation is either kept and credited, or
  restored and not credited (:meth:`~._install.Installation.offer`), whatever
  the allocator, a signal handler or another thread does; ``startup_complete``
  always ends what was installed;
* before the offer, any exception (``BaseException`` included) leaves nothing
  installed; ``KeyboardInterrupt`` and ``SystemExit`` still propagate;
* under ``on_error = "raise"`` every outcome that credits 0 raises one line
  (after the tensor-parallel agreement, so every rank raises), except
  ``enabled = false``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from ._agree import Agreement, RankOutcome, agree, settings_digest
from ._allocator import refuse_async
from ._basis import CreditBasis, measure_basis
from ._credit import Credit
from ._decision import choose_regions
from ._errors import L2EvictError, RuntimeContractError
from ._install import Installation, install
from ._lifecycle import PROCESS, Startup
from ._log import say
from ._outcome import DISABLED, NO_REPORT, Clock, Local, nothing, reason_of, report_of
from ._report import ReclaimReport, StartupAudit
from ._runtime import (
    Placement,
    RuntimeFacts,
    Snapshot,
    placement,
    read_runtime,
    read_tensors,
    snapshot as read_snapshot,
)
from ._settings import L2EvictSettings, read_section, settings_from_section, wants_raise
from ._text import shown
from ._weights import storages_of, weight_choice

log = logging.getLogger("flare_l2evict")


def run(runtime: object) -> ReclaimReport:
    """``before_first_capture``: never raises an ``Exception`` unless ``on_error = "raise"``."""
    startup, new = PROCESS.begin(runtime)
    if not new:
        return _refused(runtime, startup)
    try:
        return _run(runtime, startup)
    except BaseException as error:
        # This start-up's installation stays only if its credit was offered.
        mine = startup.installation
        if mine is not None:
            mine.offer_over()
            if mine.offered_bytes == 0:
                mine.restore()
        _settle(startup, None)
        if issubclass(type(error), L2EvictError) or not issubclass(type(error), Exception):
            if mine is None or mine.offered_bytes == 0:
                # Nothing offered, nothing installed: a retry, with this runtime or a
                # fresh one, begins anew instead of meeting a start-up that raised.
                PROCESS.end(runtime)
            raise  # on_error = "raise", KeyboardInterrupt, SystemExit
        return nothing(runtime, f"internal error in flare_l2evict ({reason_of(error)})")


def _run(runtime: object, startup: Startup) -> ReclaimReport:
    clock = Clock()
    with clock.step("runtime"):
        seen = read_snapshot(runtime)
        where = placement(seen)
    local = _prepare(seen, startup, clock)
    with clock.step("agree"):
        agreed = _agree(where, local.credit, local.settings)
    installation = _kept(startup, local, agreed)
    if installation is None and local.credit.nbytes and agreed.reclaimed_bytes:
        agreed = Agreement(0, agreed.fallback_ranks, "startup_complete ran during the hook")
    report = report_of(where, local, agreed, installation, clock.total())
    if installation is None or local.add is None:
        return _fell_back(startup, report, local)
    return _offer(local.add, report, installation, startup, local)


def _prepare(seen: Snapshot, startup: Startup, clock: Clock) -> Local:
    """Settings, runtime, basis, choice and installation: this rank's credit, or why it is 0."""
    local = Local()
    try:
        with clock.step("settings"):
            _read_settings(seen, local)
        with clock.step("runtime"):
            facts = read_runtime(seen)
            refuse_async(facts.add_reclaimed)
        settings = local.settings
        if settings is None:  # a config that is no mapping: read_runtime named it already
            raise RuntimeContractError("runtime.config is not a mapping")
        if not settings.enabled:
            local.credit = Credit(0, DISABLED)
            return local
        with clock.step("seam"):
            basis = measure_basis(facts.device, facts.l2_cache_bytes, settings, facts.race_jobs)
        local.basis, local.add = basis, facts.add_reclaimed
        local.credit = _choose_and_install(facts, settings, basis, startup, clock)
        _refuse_unheld(startup, local)
    except Exception as caught:
        if startup.installation is not None:
            startup.installation.restore()
        local.error = caught
        local.credit = Credit(0, reason_of(caught))
    except BaseException:
        if startup.installation is not None:
            startup.installation.restore()
        raise
    return local


def _refuse_unheld(startup: Startup, local: Local) -> None:
    """No credit for memory only the eviction holds (a copy ``resident_tensors()`` made).

    Checked once the hook holds no host mapping (``_choose_and_install`` has
    returned): then every other holder of a storage read is the host's.
    """
    made = startup.installation
    if local.credit.nbytes and made is not None and (unheld := made.unheld()) is not None:
        made.restore()
        local.credit = Credit(
            0,
            f"{unheld}; fix: resident_tensors() must return the tensors "
            "the model keeps resident, not copies",
        )


def _read_settings(seen: Snapshot, local: Local) -> None:
    """Settings first, so ``on_error = "raise"`` also covers the runtime's faults.

    The section is read once, so both see the same values. A config that is
    no mapping at all is the runtime's fault, named by ``read_runtime``.
    """
    config = seen.get("config")
    if config is None or isinstance(config, Mapping):
        section = read_section(config)
        local.raising = wants_raise(section)
        local.settings = settings_from_section(section)
        local.raising = local.settings.on_error == "raise"


def _choose_and_install(
    facts: RuntimeFacts,
    settings: L2EvictSettings,
    basis: CreditBasis,
    startup: Startup,
    clock: Clock,
) -> Credit:
    """The choice on this rank's tensors, installed when it covers the window; its credit.

    The installation computes the credit (from what it really reads) and is
    recorded on ``startup`` at once, so every guard after this sees it; one
    that credits nothing is restored here.
    """
    with clock.step("source"):
        found, held = storages_of(read_tensors(facts), facts.device)
        choice = choose_regions(
            found, basis.window_bytes, settings.exclude, where=str(facts.device)
        )
    if choice.shortfall is not None:
        return Credit(0, choice.shortfall)
    with clock.step("install"):
        made = startup.installation = install(weight_choice(choice, held, facts.device), basis)
    if made.credit.nbytes == 0:
        made.restore()
    return made.credit


def _kept(startup: Startup, local: Local, agreed: Agreement) -> Installation | None:
    """This start-up's installation, if it credits, the ranks agreed and the start-up is current.

    ``startup.installation`` is the one handle on what this start-up made
    (the process's, :attr:`~._lifecycle.Process.installed`, may be another's).
    """
    installation = startup.installation
    if installation is None or installation.restored:
        return None
    if agreed.reclaimed_bytes == 0 or local.add is None or not PROCESS.current(startup):
        installation.restore()  # ranks race alike: if nothing is credited, nobody reads weights
        return None
    return installation


def _offer(
    add: Callable[[ReclaimReport], object],
    report: ReclaimReport,
    installation: Installation,
    startup: Startup,
    local: Local,
) -> ReclaimReport:
    """Hand the report to the KV allocator, once; from here on the credit stays backed."""
    try:
        offered = installation.offer(add, report, lambda: PROCESS.current(startup))
    except BaseException as raised:
        report = report.model_copy(update={"allocator_error": installation.allocator_error})
        _settle(startup, report)
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
    if not offered:  # startup_complete came between the agreement and the offer
        installation.restore()
        report = report.model_copy(
            update={
                "reclaimed_bytes": 0,
                "mechanism": "none",
                "reason": "startup_complete ran during before_first_capture",
            }
        )
        return _fell_back(startup, report, local)
    _settle(startup, report)
    say(log, logging.INFO, "flare_l2evict: %s", report.summary())
    return report


def _fell_back(startup: Startup, report: ReclaimReport, local: Local) -> ReclaimReport:
    """Stock b12x kept: one WARNING line; under ``on_error = "raise"`` the same line raised."""
    _settle(startup, report)
    say(log, logging.WARNING, "flare_l2evict: stock b12x eviction kept; %s", report.summary())
    disabled = local.settings is not None and not local.settings.enabled
    if local.raising and not disabled:
        raise L2EvictError(
            f"l2evict failed and on_error = 'raise': {report.reason}"
        ) from local.error
    return report


def _settle(startup: Startup, report: ReclaimReport | None) -> None:
    """Record the start-up as done, with its report."""
    with PROCESS.lock:
        startup.report = report or startup.report or NO_REPORT


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


def _refused(runtime: object, busy: Startup) -> ReclaimReport:
    """A call while a start-up is active: 0, one line; raised under ``on_error = "raise"``."""
    installation = PROCESS.installed
    if busy.runtime is not runtime and busy.report is not None:
        how = "a second model's call (another runtime's start-up is active)"
    elif busy.thread == threading.get_ident() and busy.report is None:
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
    report = nothing(runtime, reason)
    if _wants_raise(runtime):
        raise L2EvictError(f"l2evict failed and on_error = 'raise': {reason}")
    return report


def _wants_raise(runtime: object) -> bool:
    """Whether ``runtime``'s config asks for ``on_error = "raise"``; never raises."""
    try:
        config = read_snapshot(runtime).get("config")
        return isinstance(config, Mapping) and wants_raise(read_section(config))
    except Exception:
        return False


def finish(runtime: object | None = None) -> StartupAudit:
    """``startup_complete``: audit, stock b12x back, no reference to the weights.

    Ends only the start-up ``runtime`` began (``None``: whichever is active);
    any other call changes nothing and logs one line. Always ends what is
    installed when it ends a start-up (or when none is active). Never raises
    an ``Exception``: it is the host's last start-up step.
    """
    ended, refusal = PROCESS.end(runtime)
    if refusal is not None:
        say(log, logging.WARNING, "flare_l2evict: %s", refusal)
        return StartupAudit(mechanism="none")
    installation = PROCESS.installed
    try:
        audit = StartupAudit(mechanism="none") if installation is None else installation.audit()
    except Exception as error:
        audit = StartupAudit(mechanism="none", device=f"audit failed: {reason_of(error)}")
    if installation is not None:
        installation.end()
    if ended is not None or installation is not None:
        level = logging.WARNING if audit.warns else logging.INFO
        say(log, level, "flare_l2evict: audit: %s", audit.summary())
    return audit
