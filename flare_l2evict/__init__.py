"""flare-l2evict: b12x start-up races evict L2 by reading resident weights.

The flow, one module each: choose the source (:func:`choose_source`), build
the eviction (:class:`WeightEviction`), install it into b12x (:func:`install`,
:func:`restore`), report (:class:`ReclaimReport`). :mod:`flare_l2evict.plugin`
is the ``flare.plugins`` entry point; :mod:`flare_l2evict.hookspec` is the host
contract.
"""

from ._agree import Agreement, RankOutcome, agree
from ._errors import (
    CheckpointError,
    ConfigError,
    InstallError,
    L2EvictError,
    PluginNotFoundError,
    SourceError,
)
from ._eviction import WeightEviction
from ._install import Installation, active_installation, install, restore
from ._report import ReclaimReport, SourceRead
from ._settings import L2EvictSettings, load_deployment_config, settings_from_config
from ._source import SourceChoice, SourceStorage, choose_source
from ._window import stock_buffer_bytes, stock_window_bytes
from .hookspec import FlareRuntime, FlareStartupSpec, KVAllocator, hookimpl, hookspec

__version__ = "0.1.0"

__all__ = [
    "Agreement",
    "CheckpointError",
    "ConfigError",
    "FlareRuntime",
    "FlareStartupSpec",
    "InstallError",
    "Installation",
    "KVAllocator",
    "L2EvictError",
    "L2EvictSettings",
    "PluginNotFoundError",
    "RankOutcome",
    "ReclaimReport",
    "SourceChoice",
    "SourceError",
    "SourceRead",
    "SourceStorage",
    "WeightEviction",
    "__version__",
    "active_installation",
    "agree",
    "choose_source",
    "hookimpl",
    "hookspec",
    "install",
    "load_deployment_config",
    "restore",
    "settings_from_config",
    "stock_buffer_bytes",
    "stock_window_bytes",
]
