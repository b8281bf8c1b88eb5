"""The ``flare.plugins`` entry point ``l2evict``: the hook implementations."""

from __future__ import annotations

from . import _startup
from ._markers import hookimpl
from ._report import ReclaimReport, StartupAudit
from .hookspecs import FlareRuntime


@hookimpl
def before_first_capture(runtime: FlareRuntime) -> ReclaimReport:
    """Point b12x's race eviction at resident weights and credit the KV allocator."""
    return _startup.run(runtime)


@hookimpl
def startup_complete(runtime: FlareRuntime) -> StartupAudit:
    """Audit the races, restore stock b12x and drop every reference to the weights.

    Ends only the start-up this ``runtime`` began (or whose report it is); any
    other call is a no-op with one line. Never raises an ``Exception``.
    """
    return _startup.finish(runtime)


def finish() -> StartupAudit:
    """End whichever start-up is active, credited or not (tests, and an operator's last resort)."""
    return _startup.finish(None, force=True)
