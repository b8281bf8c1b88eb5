"""The plugin's section of the deployment config: ``[plugins.l2evict]``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import islice
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError, field_validator

from ._credit import stock_buffer_bytes
from ._errors import ConfigError
from ._globs import wildcard_between_stars
from ._text import literal, shown

SECTION = ("plugins", "l2evict")
_SECTION_NAME = ".".join(SECTION)
DISABLED = f"disabled by config ({_SECTION_NAME}.enabled = false)"
"""The one reason start-up, check and plan give when the deployment turned the plugin off."""

_UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}  # by the unit's first letter
# One run of blanks between digits and unit, so no two quantifiers compete for a character
# (``\s*...\s*$`` backtracked quadratically on "1" + spaces + "x"). ASCII digits only: int()
# would read "２５６" too, but no operator means that.
_SIZE = re.compile(r"([0-9]+)[ \t]*([kmg]i?b|b)?", re.IGNORECASE)
_SIZE_CHARS = 32  # longer than any size a window takes ("68719476736 b" is 13)

MAX_EXCLUDE_PATTERNS = 8
"""Globs ``exclude`` may list: each reads every resident tensor's name once (``_globs``)."""
MAX_PATTERN_CHARS = 1000
"""Characters of one ``exclude`` glob: tensor names are far shorter."""
MAX_PATTERN_STARS = 4
"""``*`` one glob may hold. A ``?`` or ``[...]`` may stand only before the first or after the
last: between two, each name would be read again from every position (``_globs``)."""

MAX_SECTION_KEYS = 64
"""Keys the section may hold before it is refused unread: it takes 4, and a host's mapping
may never end (1,000,000 keys took 8.6 to 36 s and 1.75 GB when all were read)."""

MIN_WINDOW_BYTES = 1 << 20
"""A window below 1 MiB displaces no GPU's L2; it is a typo, not a setting."""
MAX_WINDOW_BYTES = 64 << 30
"""A window above 64 GiB is larger than any checkpoint shard it could read."""

# What each key accepts, in the words an error message uses.
ALLOWED: dict[str, str] = {
    "enabled": "true or false",
    "window": "'stock' (the default: max(2 x L2, 64 MiB), what stock b12x reads), "
    "or a whole number of bytes divisible by 4 between 1 MiB and 64 GiB, "
    "such as '256MiB' (KB, MB, GB are binary: KiB, MiB, GiB)",
    "exclude": "a list of tensor-name glob patterns, such as ['*.embed_tokens.*'] (at most "
    f"{MAX_EXCLUDE_PATTERNS}, each at most {MAX_PATTERN_CHARS:,} characters and "
    f"{MAX_PATTERN_STARS} '*'; '?' and '[...]' only before the first '*' or after the last)",
    "on_error": "'fallback' (the default: keep stock b12x and reclaim 0) or 'raise'",
}


class L2EvictSettings(BaseModel):
    """``[plugins.l2evict]``: every key is optional (:data:`ALLOWED`); unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: StrictBool = True
    window: int | Literal["stock"] = "stock"
    exclude: tuple[str, ...] = ()
    on_error: Literal["fallback", "raise"] = "fallback"

    def window_bytes(self, l2_cache_bytes: int) -> int:
        """The bytes each eviction reads with this L2 size (``"stock"``: stock's buffer's)."""
        return stock_buffer_bytes(l2_cache_bytes) if self.window == "stock" else int(self.window)

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, value: object) -> int | str:
        size = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str):
            lowered = value.strip().lower()  # linear; what is left is at most _SIZE_CHARS long
            if lowered == "stock":
                return lowered
            match = _SIZE.fullmatch(lowered) if len(lowered) <= _SIZE_CHARS else None
            if match:
                size = int(match.group(1)) * _UNITS[(match.group(2) or "b")[0]]
        # The eviction reads whole float32 words; a window it cannot read in full
        # would be credited for reads that never happen.
        if size is None or not (MIN_WINDOW_BYTES <= size <= MAX_WINDOW_BYTES and size % 4 == 0):
            raise ValueError(f"use {ALLOWED['window']}")
        return size

    @field_validator("exclude", mode="before")
    @classmethod
    def _exclude(cls, value: object) -> object:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ValueError(f"use {ALLOWED['exclude']}")
        # The builtin's own length and iteration: a subclass's may lie or never end.
        size, each = (
            (list.__len__(value), list.__iter__(value))
            if isinstance(value, list)
            else (tuple.__len__(value), tuple.__iter__(value))
        )
        if size > MAX_EXCLUDE_PATTERNS:
            raise ValueError(f"use {ALLOWED['exclude']}")
        # Plain text first: a str subclass's len and count could lie about the limits.
        items = tuple(str.__str__(item) if isinstance(item, str) else item for item in each)
        if (
            len(items) > MAX_EXCLUDE_PATTERNS
            or not all(isinstance(i, str) and 0 < len(i) <= MAX_PATTERN_CHARS for i in items)
            or any(item.count("*") > MAX_PATTERN_STARS for item in items)
            or any(map(wildcard_between_stars, items))
        ):
            raise ValueError(f"use {ALLOWED['exclude']}")
        return items


_PROBLEMS_SHOWN = 3  # a section of 10,000 bad keys still gives one short line


def _one_line(error: ValidationError, section: Mapping[str, Any]) -> str:
    problems = []
    for item in error.errors():
        key = str(item["loc"][0]) if item["loc"] else "?"
        name = f"{_SECTION_NAME}.{shown(key, 60)}"
        # A key that is no field (unknown, or not even a string, as YAML allows) is unknown.
        if item["type"] == "extra_forbidden" or key not in ALLOWED:
            problems.append(f"{name}: unknown key (allowed keys: {', '.join(ALLOWED)})")
        else:
            problems.append(f"{name} = {literal(section.get(key))} is invalid: use {ALLOWED[key]}")
    unique = list(dict.fromkeys(problems))
    more = len(unique) - _PROBLEMS_SHOWN
    listed = "; ".join(unique[:_PROBLEMS_SHOWN]) + (f"; and {more:,} more" if more > 0 else "")
    return f"{listed}; fix: correct the deployment config's [{_SECTION_NAME}] at the key named"


def read_section(config: object) -> dict[str, Any]:
    """The section as a plain dict (``{}`` when absent); :class:`ConfigError` if a table is not one.

    Read once: later steps see the same values, even from a host mapping answering differently.
    """
    section: object = {} if config is None else config
    for depth, part in enumerate(SECTION):
        if not isinstance(section, Mapping):
            where = ".".join(SECTION[:depth]) or "the deployment config"
            raise ConfigError(
                f"[{where}] must be a table of keys, not {type(section).__name__} "
                f"({literal(section, 60)}); fix: make it a table"
            )
        section = section.get(part, {})
        section = {} if section is None else section
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"[{_SECTION_NAME}] must be a table of keys ({', '.join(ALLOWED)}), "
            f"not {type(section).__name__}"
        )
    return _bounded_copy(section)


def _bounded_copy(section: Mapping[Any, Any]) -> dict[Any, Any]:
    """The section's keys and values, read only up to :data:`MAX_SECTION_KEYS` keys.

    The mappings on the way here are only asked for one key each (``get``), never iterated.
    """
    # One key past the cap tells "too many" without counting: len() may lie, and
    # iteration may never end.
    keys = list(islice(iter(section), MAX_SECTION_KEYS + 1))
    if len(keys) > MAX_SECTION_KEYS:
        raise ConfigError(
            f"[{_SECTION_NAME}] holds more than {MAX_SECTION_KEYS} keys (read no further); "
            f"it takes at most {len(ALLOWED)}: {', '.join(ALLOWED)}; fix: keep only those "
            f"keys in the deployment config's [{_SECTION_NAME}]"
        )
    return {key: section[key] for key in keys}


def settings_from_section(section: Mapping[str, Any]) -> L2EvictSettings:
    """The validated section (:func:`read_section`); :class:`ConfigError` naming each bad key."""
    section = _bounded_copy(section)
    try:
        return L2EvictSettings.model_validate(section)
    except ValidationError as error:
        raise ConfigError(_one_line(error, section)) from None


def wants_raise(section: Mapping[str, Any]) -> bool:
    """Whether the section's ``on_error`` is the plain str ``"raise"`` (not just equal to it)."""
    value = section.get("on_error")
    return type(value) is str and value == "raise"
