"""flare-l2evict: b12x start-up races evict L2 by reading resident weights.

The public names are those of ``_EXPORTS`` (everything ``_*`` is private and
may change in any release). They are imported on first use, so ``import
flare_l2evict`` (and the CLI's ``--help``) pays for neither torch nor pluggy; the
``TYPE_CHECKING`` block mirrors ``_EXPORTS`` (``name as name``: an explicit
re-export, which strict checkers need), and a test holds the two equal.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.4.0"

_EXPORTS: dict[str, str] = {
    "CheckpointError": "_errors",
    "ConfigError": "_errors",
    "InstallError": "_errors",
    "L2EvictError": "_errors",
    "PluginNotFoundError": "_errors",
    "RuntimeContractError": "_errors",
    "WeightsError": "_errors",
    "restore": "_startup",
    "hookimpl": "_markers",
    "hookspec": "_markers",
    "evicting_from": "_program",
    "DeviceAudit": "_report",
    "ReclaimReport": "_report",
    "RegionRead": "_report",
    "StartupAudit": "_report",
    "L2EvictSettings": "_settings",
    "load_deployment_config": "tools._config_file",
    "FlareRuntime": "hookspecs",
    "FlareStartupSpec": "hookspecs",
    "KVAllocator": "hookspecs",
}

__all__ = [*_EXPORTS, "__version__", "hookspecs"]


def __getattr__(name: str) -> Any:
    if name == "hookspecs":  # the module itself, on first use (pluggy's import is not free)
        return importlib.import_module(".hookspecs", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flare_l2evict' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from ._errors import (
        CheckpointError as CheckpointError,
        ConfigError as ConfigError,
        InstallError as InstallError,
        L2EvictError as L2EvictError,
        PluginNotFoundError as PluginNotFoundError,
        RuntimeContractError as RuntimeContractError,
        WeightsError as WeightsError,
    )
    from ._markers import (
        hookimpl as hookimpl,
        hookspec as hookspec,
    )
    from ._program import evicting_from as evicting_from
    from ._report import (
        DeviceAudit as DeviceAudit,
        ReclaimReport as ReclaimReport,
        RegionRead as RegionRead,
        StartupAudit as StartupAudit,
    )
    from ._settings import L2EvictSettings as L2EvictSettings
    from ._startup import restore as restore
    from .hookspecs import (
        FlareRuntime as FlareRuntime,
        FlareStartupSpec as FlareStartupSpec,
        KVAllocator as KVAllocator,
    )
    from .tools._config_file import load_deployment_config as load_deployment_config

if TYPE_CHECKING:  # the module itself, loaded on first use by __getattr__ above
    from . import hookspecs as hookspecs
