"""The host's side of a start-up: read the runtime once, then run the core; end it.

:func:`run` is ``before_first_capture``; :func:`finish` is ``startup_complete``.
One ``before_first_capture`` at a time per process: a call made while a
start-up is in progress or done (re-entrant, another thread, a second model,
repeated) credits 0 and touches nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from . import _core
from ._core import Clock, Local
from ._credit import Credit
from ._errors import L2EvictError, RuntimeContractError, reason_of
from ._lifecycle import PROCESS, Startup, ensure_ended
from ._log import say
from ._report import HOST, ReclaimReport, StartupAudit
from ._runtime import Snapshot, placement, read_runtime, read_tensors, snapshot as read_snapshot
from ._settings import read_section, settings_from_section, wants_raise
from ._text import shown

log = logging.getLogger("flare_l2evict")


def run(runtime: object) -> ReclaimReport:
    """``before_first_capture``: never raises an ``Exception`` unless ``on_error = "raise"``."""
    startup, new = PROCESS.begin(runtime)
    if not new:
        return _refused(runtime, startup)
    return _core.guarded(
        startup,
        lambda clock: _from_host(runtime, startup, clock),
        lambda why: nothing(runtime, why),
    )


def _from_host(runtime: object, startup: Startup, clock: Clock) -> ReclaimReport:
    """The host reader: the runtime read once, checked into the core's request."""
    with clock.step("runtime"):
        seen = read_snapshot(runtime)
        where = placement(seen)
    local = Local()
    request = None
    try:
        with clock.step("settings"):
            _read_settings(seen, local)
        with clock.step("runtime"):
            facts = read_runtime(seen)
        if local.settings is None:  # a config that is no mapping: read_runtime named it already
            raise RuntimeContractError("runtime.config is not a mapping")
        request = _core.Request(
            facts.device,
            facts.l2_cache_bytes,
            facts.race_jobs,
            lambda: read_tensors(facts),
            facts.add_reclaimed,
            HOST,
        )
    except Exception as caught:
        local.error = caught
        local.credit = Credit(0, reason_of(caught))
    return _core.start(startup, where, local, request, clock)


def _read_settings(seen: Snapshot, local: Local) -> None:
    """Settings first, so ``on_error = "raise"`` also covers the runtime's faults."""
    config = seen.get("config")
    if config is None or isinstance(config, Mapping):
        section = read_section(config)
        local.raising = wants_raise(section)
        local.settings = settings_from_section(section)
        local.raising = local.settings.on_error == "raise"


def nothing(runtime: object, reason: str) -> ReclaimReport:
    """A report of 0 bytes for a call that changed nothing, logged as one WARNING line."""
    where = placement(read_snapshot(runtime))
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


def finish(runtime: object | None = None, *, force: bool = False) -> StartupAudit:
    """``startup_complete``: audit, stock b12x back, no reference to the weights. Ends only
    the start-up ``runtime`` ends (``force``: any), else one line; never raises an ``Exception``."""
    try:
        return _finish(runtime, force)
    except Exception as error:  # never the host's problem: one line, stock b12x put back
        say(log, logging.WARNING, "flare_l2evict: startup_complete failed: %s", reason_of(error))
        return StartupAudit(mechanism="none", device=f"audit failed: {reason_of(error)}")
    finally:  # whatever cut the above short: nothing stays installed once no start-up is
        ensure_ended(runtime, force)


def _finish(runtime: object | None, force: bool) -> StartupAudit:
    ended, refusal = PROCESS.end(runtime, force)
    if refusal is not None:
        say(log, logging.WARNING, "flare_l2evict: %s", refusal)
        return StartupAudit(mechanism="none", refused=refusal)
    installation = ended.installation if ended is not None else None
    if installation is None or (installation.restored and not installation.offered_bytes):
        installation = PROCESS.installed
    try:
        audit = StartupAudit(mechanism="none") if installation is None else installation.audit()
    except Exception as error:
        audit = StartupAudit(mechanism="none", device=f"audit failed: {reason_of(error)}")
    if installation is None:
        if ended is not None:
            say(log, logging.INFO, "flare_l2evict: audit: %s", audit.summary())
        return audit
    installation.end()
    level = logging.WARNING if audit.warns or installation.undo_error else logging.INFO
    line = audit.summary(installation.words)
    if installation.undo_error:
        line += f"; RESTORE FAILED: {installation.undo_error} (stock b12x may not be back)"
    say(log, level, "flare_l2evict: audit: %s", line)
    return audit
