"""The CLI's input checks that need neither torch nor b12x; torch-free.

A typo in a flag, a plugin name, a path or a config costs the operator the
seconds torch takes to import (7 to 10 s on a CPU machine) unless it is
refused first: every check here runs before the command imports torch, and
raises the same one-line error the later reader would.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import Field, NonNegativeInt

from .._errors import PluginNotFoundError
from .._markers import ENTRY_POINT_GROUP
from .._settings import (
    DISABLED as DISABLED,
    SECTION,
    L2EvictSettings,
    locate_section,
    read_section,
    settings_from_section,
)
from .._text import shown
from ._headers import missing_checkpoint as missing_checkpoint
from ._json_output import Output

_SECTION = f"[{'.'.join(SECTION)}]"
_PATH_CHARS = 4096
"""Characters of the config's path echoed whole: Linux's PATH_MAX, the longest path a file
was opened by. It is the operator's own argument, to be copied back, so it is not cut at
:data:`flare_l2evict._text.LIMIT` as a value from elsewhere is."""


class ConfigFound(Output):
    """Where the plugin's settings came from: the config given, and whether it holds the section."""

    file: str | None = Field(description="The --config file read, or null: none was given.")
    found: bool = Field(
        description="Whether the config holds [plugins.l2evict]; false: its defaults apply. A "
        "section whose name is near it is refused (exit 2), never passed over."
    )
    keys: NonNegativeInt = Field(description="Keys the section holds (0 when it is not found).")

    def line(self) -> str:
        """``config: ...``, the line ``check``, ``plan`` and ``startup`` print."""
        if self.file is None:
            return "config: none given: defaults apply"
        where = shown(self.file, _PATH_CHARS)
        if not self.found:
            return f"config: no {_SECTION} in {where}: defaults apply"
        return f"config: {_SECTION} found in {where}, {self.keys} key{'s' * (self.keys != 1)}"

    def whole(self) -> tuple[str, ...]:
        """What of :meth:`line` an operator copies, never to be broken: the file as shown."""
        return () if self.file is None else (shown(self.file, _PATH_CHARS),)


@dataclass(frozen=True)
class Deployment:
    """A ``--config`` file as a command reads it: the mapping, its settings, where they are from."""

    config: dict[str, Any]
    settings: L2EvictSettings
    found: ConfigFound


def read_deployment(path: Path | None) -> Deployment:
    """``--config``'s file (``None``: none given) read and checked, before torch is imported.

    Raises :class:`~flare_l2evict.ConfigError` in one line: a file that cannot be read, a
    bad key or value, a section over its key cap, or one named near ``[plugins.l2evict]``.
    """
    from ._config_file import load_deployment_config

    config = load_deployment_config(path) if path is not None else {}
    section = locate_section(config)
    return Deployment(
        config,
        settings_from_section(section.keys),
        ConfigFound(
            file=None if path is None else str(path),
            found=section.found,
            keys=len(section.keys),
        ),
    )


def installed_plugins() -> list[str]:
    """Names of the ``flare.plugins`` entry points installed in this environment."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def refuse_unknown_plugins(names: Sequence[str]) -> None:
    """Raise :class:`PluginNotFoundError` for the first name no entry point has."""
    installed = installed_plugins()
    for name in names:
        if name not in installed:
            fix = "pip install the package that provides it, or drop the flag"
            nearest = difflib.get_close_matches(name, installed, n=1, cutoff=0.75)
            if nearest:
                fix = f"did you mean --plugin {nearest[0]}? (else {fix})"
            raise PluginNotFoundError(
                f"--plugin {name}: no such flare plugin is installed "
                f"(installed: {', '.join(installed) or 'none'}); fix: {fix}"
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
