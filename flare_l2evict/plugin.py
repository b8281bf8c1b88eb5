"""The ``flare.plugins`` entry point ``l2evict``: the adapter for flare hosts.

Each hook only translates: the host's ``runtime`` becomes the core's request
(:func:`._read_host.request_from`, which never raises) and runs (:func:`._core.start`);
``startup_complete`` ends the start-up that runtime (or a report it got) owns.
"""

from __future__ import annotations

from . import _core
from ._markers import hookimpl
from ._read_host import request_from
from ._report import ReclaimReport, StartupAudit
from ._startup import Startup
from .hookspecs import FlareRuntime


@hookimpl
def before_first_capture(runtime: FlareRuntime) -> ReclaimReport:
    """Point b12x's race eviction at resident weights and credit the KV allocator."""
    return _core.start(request_from(runtime))


@hookimpl
def startup_complete(runtime: FlareRuntime) -> StartupAudit:
    """Audit the races, restore stock b12x and drop every reference to the weights.

    Ends only the start-up this ``runtime`` began (or whose report it is); any
    other call is a no-op with one line. Never raises an ``Exception``.
    """
    return Startup.end(runtime)
