"""The ``flare.plugins`` entry point ``l2evict``: the hook implementations.

pluggy registers this module itself; its state lives in one
:class:`~flare_l2evict._startup.L2EvictStartup` per process.
"""

from __future__ import annotations

from ._report import ReclaimReport
from ._startup import L2EvictStartup
from .hookspec import FlareRuntime, hookimpl

_STARTUP = L2EvictStartup()


@hookimpl
def before_first_capture(runtime: FlareRuntime) -> ReclaimReport:
    """Point b12x's race eviction at resident weights and credit the KV allocator."""
    return _STARTUP.run(runtime)


@hookimpl
def startup_complete(runtime: FlareRuntime) -> None:
    """Restore stock b12x and drop every reference to the weights."""
    _STARTUP.finish()
