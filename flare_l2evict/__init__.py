"""flare-l2evict: b12x start-up races evict L2 by reading resident weights.

The flow, one module each: check the host's runtime (:func:`read_runtime`),
choose the source (:func:`choose_source`), prove b12x's seam
(:func:`prove_seam`), build and install the eviction (:class:`WeightEviction`,
:func:`install`, :func:`restore`), compute the credit (:func:`credit`), agree
across ranks (:func:`agree`), report (:class:`ReclaimReport`) and audit
(:class:`StartupAudit`). :mod:`flare_l2evict.plugin` is the ``flare.plugins``
entry point; :mod:`flare_l2evict.hookspec` is the host contract;
:mod:`flare_l2evict.tools` holds the CLI, plan, reference host and bench.

Names are imported on first use, so ``import flare_l2evict`` (and the CLI's
``--help``) does not pay for torch until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The host contract is cheap (pluggy only) and binds the name ``hookspec`` to the
# marker, as pluggy users expect, rather than to the submodule of that name.
from .hookspec import FlareRuntime, FlareStartupSpec, KVAllocator, hookimpl, hookspec

__version__ = "0.3.0"

_EXPORTS: dict[str, str] = {
    "Agreement": "_agree",
    "RankOutcome": "_agree",
    "agree": "_agree",
    "Credit": "_credit",
    "credit": "_credit",
    "CheckpointError": "_errors",
    "ConfigError": "_errors",
    "InstallError": "_errors",
    "L2EvictError": "_errors",
    "PluginNotFoundError": "_errors",
    "RuntimeContractError": "_errors",
    "SourceError": "_errors",
    "WeightEviction": "_eviction",
    "EVICTION_OWN_BYTES": "_eviction",
    "OWN_BYTES": "_eviction",
    "READ_KERNEL_BYTES": "_eviction",
    "read_bytes_for": "_eviction",
    "Installation": "_install",
    "active_installation": "_install",
    "install": "_install",
    "restore": "_install",
    "DeviceAudit": "_report",
    "ReclaimReport": "_report",
    "SourceRead": "_report",
    "StartupAudit": "_report",
    "RuntimeFacts": "_runtime",
    "read_runtime": "_runtime",
    "SeamProof": "_seam",
    "StockBuffer": "_seam",
    "measure_stock_buffer": "_seam",
    "prove_seam": "_seam",
    "L2EvictSettings": "_settings",
    "load_deployment_config": "_settings",
    "settings_from_config": "_settings",
    "SourceChoice": "_source",
    "SourceStorage": "_source",
    "choose_source": "_source",
    "stock_buffer_bytes": "_window",
    "stock_window_bytes": "_window",
}

__all__ = [
    "EVICTION_OWN_BYTES",
    "OWN_BYTES",
    "READ_KERNEL_BYTES",
    "Agreement",
    "CheckpointError",
    "ConfigError",
    "Credit",
    "DeviceAudit",
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
    "RuntimeContractError",
    "RuntimeFacts",
    "SeamProof",
    "SourceChoice",
    "SourceError",
    "SourceRead",
    "SourceStorage",
    "StartupAudit",
    "StockBuffer",
    "WeightEviction",
    "__version__",
    "active_installation",
    "agree",
    "choose_source",
    "credit",
    "hookimpl",
    "hookspec",
    "install",
    "load_deployment_config",
    "measure_stock_buffer",
    "prove_seam",
    "read_bytes_for",
    "read_runtime",
    "restore",
    "settings_from_config",
    "stock_buffer_bytes",
    "stock_window_bytes",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flare_l2evict' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from ._agree import Agreement, RankOutcome, agree
    from ._credit import Credit, credit
    from ._errors import (
        CheckpointError,
        ConfigError,
        InstallError,
        L2EvictError,
        PluginNotFoundError,
        RuntimeContractError,
        SourceError,
    )
    from ._eviction import (
        EVICTION_OWN_BYTES,
        OWN_BYTES,
        READ_KERNEL_BYTES,
        WeightEviction,
        read_bytes_for,
    )
    from ._install import Installation, active_installation, install, restore
    from ._report import DeviceAudit, ReclaimReport, SourceRead, StartupAudit
    from ._runtime import RuntimeFacts, read_runtime
    from ._seam import SeamProof, StockBuffer, measure_stock_buffer, prove_seam
    from ._settings import L2EvictSettings, load_deployment_config, settings_from_config
    from ._source import SourceChoice, SourceStorage, choose_source
    from ._window import stock_buffer_bytes, stock_window_bytes
