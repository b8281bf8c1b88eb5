"""The CLI's input checks that need neither torch nor b12x; torch-free.

A typo in a flag, a plugin name, a path or a config costs the operator the
seconds torch takes to import (7 to 10 s on a CPU machine) unless it is
refused first: every check here runs before the command imports torch, and
raises the same one-line error the later reader would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .._errors import PluginNotFoundError
from .._markers import ENTRY_POINT_GROUP
from .._settings import (
    DISABLED as DISABLED,
    L2EvictSettings,
    read_section,
    settings_from_section,
)
from ._headers import missing_checkpoint as missing_checkpoint


def installed_plugins() -> list[str]:
    """Names of the ``flare.plugins`` entry points installed in this environment."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def refuse_unknown_plugins(names: Sequence[str]) -> None:
    """Raise :class:`PluginNotFoundError` for the first name no entry point has."""
    installed = installed_plugins()
    for name in names:
        if name not in installed:
            raise PluginNotFoundError(
                f"--plugin {name}: no such flare plugin is installed "
                f"(installed: {', '.join(installed) or 'none'}); "
                "fix: pip install the package that provides it, or drop the flag"
            )


def refuse_unreadable_checkpoint(paths: Sequence[Path]) -> None:
    """Refuse a missing path, then read every header as ``startup`` will (headers only).

    The reference host reads the same headers again after torch is imported;
    reading them here first costs milliseconds and answers a bad file at once.
    """
    if not paths:
        return
    missing = next((path for path in paths if not path.exists()), None)
    if missing is not None:
        raise missing_checkpoint(missing)
    from ._headers import read_checkpoint

    read_checkpoint(list(paths))


def settings_from_config(config: Mapping[str, Any] | None) -> L2EvictSettings:
    """The validated ``[plugins.l2evict]`` section; defaults when it is absent.

    Raises :class:`ConfigError` in one line naming each bad key and what it accepts.
    Other sections belong to the host and are not inspected.
    """
    return settings_from_section(read_section(config))
