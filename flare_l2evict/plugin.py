"""The ``flare.plugins`` entry point ``l2evict``: the hook implementations.

pluggy registers this module itself; the start-up's state lives in one
:class:`~flare_l2evict._startup.L2EvictStartup` per process, the installation
in :mod:`flare_l2evict._install`. Imports only runtime modules (a test pins it).
"""

from __future__ import annotations

from ._markers import hookimpl
from ._report import ReclaimReport, StartupAudit
from ._startup import L2EvictStartup
from .hookspecs import FlareRuntime

_STARTUP = L2EvictStartup()


@hookimpl
def before_first_capture(runtime: FlareRuntime) -> ReclaimReport:
    """Point b12x's race eviction at resident weights and credit the KV allocator."""
    return _STARTUP.run(runtime)


@hookimpl
def startup_complete(runtime: FlareRuntime) -> StartupAudit:
    """Audit the races, restore stock b12x and drop every reference to the weights."""
    return _STARTUP.finish()


def finish() -> StartupAudit:
    """What ``startup_complete`` does, for hosts and tests that end a start-up early."""
    return _STARTUP.finish()
