"""flare-l2evict: b12x start-up races evict L2 by reading resident weights.

The flow, one module each: read the host's runtime (:func:`read_runtime`),
decide what to read and credit (:func:`decide`, torch-free; :func:`choose_source`
converts torch storages for it), prove b12x's seam (:func:`prove_seam`), build
and install the eviction (:class:`WeightEviction`, :func:`install`,
:func:`restore`), agree across ranks (:func:`agree`), report
(:class:`ReclaimReport`) and audit (:class:`StartupAudit`).
:mod:`flare_l2evict.plugin` is the ``flare.plugins`` entry point;
:mod:`flare_l2evict.hookspecs` is the host contract; :mod:`flare_l2evict.tools`
holds the CLI, plan, check, reference host and bench.

Names are imported on first use, so ``import flare_l2evict`` (and the CLI's
``--help``) does not pay for torch until something needs it. ``_EXPORTS`` is
the one list of public names; the ``TYPE_CHECKING`` block mirrors it for type
checkers (``name as name``: an explicit re-export, which strict checkers need),
and a test holds the two equal.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import hookspecs as hookspecs  # cheap (pluggy only): its dotted paths work as written

__version__ = "0.4.0"

_EXPORTS: dict[str, str] = {
    "Agreement": "_agree",
    "RankOutcome": "_agree",
    "agree": "_agree",
    "CREDIT_OVERHEAD_BYTES": "_credit",
    "EVICTION_OUTPUT_BYTES": "_credit",
    "READ_KERNEL_BYTES": "_credit",
    "Credit": "_credit",
    "credit": "_credit",
    "Decision": "_decision",
    "Storages": "_decision",
    "decide": "_decision",
    "CheckpointError": "_errors",
    "ConfigError": "_errors",
    "InstallError": "_errors",
    "L2EvictError": "_errors",
    "PluginNotFoundError": "_errors",
    "RuntimeContractError": "_errors",
    "SourceError": "_errors",
    "EvictionHandle": "_eviction",
    "WeightEviction": "_eviction",
    "Installation": "_install",
    "active_installation": "_install",
    "install": "_install",
    "restore": "_install",
    "hookimpl": "_markers",
    "hookspec": "_markers",
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
    "SourcePiece": "_source",
    "SourceStorage": "_source",
    "choose_source": "_source",
    "stock_buffer_bytes": "_window",
    "stock_window_bytes": "_window",
    "FlareRuntime": "hookspecs",
    "FlareStartupSpec": "hookspecs",
    "KVAllocator": "hookspecs",
}

__all__ = [*_EXPORTS, "__version__", "hookspecs"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flare_l2evict' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from ._agree import (
        Agreement as Agreement,
        RankOutcome as RankOutcome,
        agree as agree,
    )
    from ._credit import (
        CREDIT_OVERHEAD_BYTES as CREDIT_OVERHEAD_BYTES,
        EVICTION_OUTPUT_BYTES as EVICTION_OUTPUT_BYTES,
        READ_KERNEL_BYTES as READ_KERNEL_BYTES,
        Credit as Credit,
        credit as credit,
    )
    from ._decision import (
        Decision as Decision,
        Storages as Storages,
        decide as decide,
    )
    from ._errors import (
        CheckpointError as CheckpointError,
        ConfigError as ConfigError,
        InstallError as InstallError,
        L2EvictError as L2EvictError,
        PluginNotFoundError as PluginNotFoundError,
        RuntimeContractError as RuntimeContractError,
        SourceError as SourceError,
    )
    from ._eviction import (
        EvictionHandle as EvictionHandle,
        WeightEviction as WeightEviction,
    )
    from ._install import (
        Installation as Installation,
        active_installation as active_installation,
        install as install,
        restore as restore,
    )
    from ._markers import (
        hookimpl as hookimpl,
        hookspec as hookspec,
    )
    from ._report import (
        DeviceAudit as DeviceAudit,
        ReclaimReport as ReclaimReport,
        SourceRead as SourceRead,
        StartupAudit as StartupAudit,
    )
    from ._runtime import (
        RuntimeFacts as RuntimeFacts,
        read_runtime as read_runtime,
    )
    from ._seam import (
        SeamProof as SeamProof,
        StockBuffer as StockBuffer,
        measure_stock_buffer as measure_stock_buffer,
        prove_seam as prove_seam,
    )
    from ._settings import (
        L2EvictSettings as L2EvictSettings,
        load_deployment_config as load_deployment_config,
        settings_from_config as settings_from_config,
    )
    from ._source import (
        SourceChoice as SourceChoice,
        SourcePiece as SourcePiece,
        SourceStorage as SourceStorage,
        choose_source as choose_source,
    )
    from ._window import (
        stock_buffer_bytes as stock_buffer_bytes,
        stock_window_bytes as stock_window_bytes,
    )
    from .hookspecs import (
        FlareRuntime as FlareRuntime,
        FlareStartupSpec as FlareStartupSpec,
        KVAllocator as KVAllocator,
    )
