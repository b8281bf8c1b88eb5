"""The hook markers of the flare project, apart from the specs that use them (as in pluggy)."""

from __future__ import annotations

import pluggy

PROJECT_NAME = "flare"
"""The pluggy project name of the flare runtime; hook markers are bound to it."""

ENTRY_POINT_GROUP = "flare.plugins"
"""The entry-point group a host loads plugins from, filtered by ``--plugin NAME``."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks a hook specification of the flare project."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's implementation of a flare hook."""
