"""The plugin's section of the deployment config: ``[plugins.l2evict]``."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError, field_validator

from ._credit import stock_buffer_bytes
from ._errors import ConfigError
from ._globs import wildcard_between_stars
from ._text import described, literal, shown

SECTION = ("plugins", "l2evict")
_SECTION_NAME = ".".join(SECTION)
DISABLED = f"disabled by config ({_SECTION_NAME}.enabled = false)"
"""The one reason start-up, check and plan give when the deployment turned the plugin off."""
TRITON_DISABLED = f"disabled by config ({_SECTION_NAME}.triton = false)"
"""Why Triton's flush stays stock when the deployment (or ``evicting_from(triton=False)``)
said so."""

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
"""Keys the section may hold before it is refused unread: it takes 5, and a host's mapping
may never end (1,000,000 keys took 8.6 to 36 s and 1.75 GB when all were read)."""

MAX_SCANNED_KEYS = 256
"""Keys read of the config's top level, and of a table whose name is near ``plugins``, to find
a section named near ``[plugins.l2evict]`` when that one is missing: more than a deployment
config holds there, and a host's mapping that never ends is read no further."""
_NEAR_CHARS = 64  # a longer key is no misspelling of either name, and is not normalised
_BARE = re.compile(r"[A-Za-z0-9_-]+")  # a key TOML writes unquoted

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
    "triton": "true (the default: while b12x's eviction is installed, Triton's autotuner "
    "flushes by reading the same weights) or false (Triton's flush stays stock)",
}


class L2EvictSettings(BaseModel):
    """``[plugins.l2evict]``: every key is optional (:data:`ALLOWED`); unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: StrictBool = True
    window: int | Literal["stock"] = "stock"
    exclude: tuple[str, ...] = ()
    on_error: Literal["fallback", "raise"] = "fallback"
    triton: StrictBool = True

    @property
    def raising(self) -> bool:
        """Whether a fallback raises (``on_error = "raise"``): :func:`on_error_raises`."""
        return on_error_raises(self.on_error)

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


@dataclass(frozen=True)
class Section:
    """``[plugins.l2evict]`` as :func:`locate_section` found it."""

    keys: dict[str, Any]
    """The section's bounded copy, ``{}`` when absent."""
    found: bool
    """Whether ``[plugins.l2evict]`` exists in the config (an empty one too)."""


_ABSENT = object()


def locate_section(config: object) -> Section:
    """The section, read once; :class:`ConfigError` if a table on the way is not one, if it
    holds more than :data:`MAX_SECTION_KEYS` keys, or if it is missing while a section whose
    name is near it is there (``[plugins.L2evict]``, ``[plugin.l2evict]``, ``[l2evict]``):
    its keys would be ignored without a word, ``enabled = false`` among them.

    Read once: later steps see the same values, even from a host mapping answering differently.
    """
    table: object = {} if config is None else config
    for depth, part in enumerate(SECTION):
        if not isinstance(table, Mapping):
            where = ".".join(SECTION[:depth]) or "the deployment config"
            raise ConfigError(
                f"[{where}] must be a table of keys, not {type(table).__name__} "
                f"({literal(table, 60)}); fix: make it a table"
            )
        table = table.get(part, _ABSENT)
        if table is _ABSENT:
            _refuse_a_near_miss(config)
            return Section({}, found=False)
        table = {} if table is None else table
    if not isinstance(table, Mapping):
        raise ConfigError(
            f"[{_SECTION_NAME}] must be a table of keys ({', '.join(ALLOWED)}), "
            f"not {type(table).__name__}"
        )
    return Section(_bounded_copy(table), found=True)


def read_section(config: object) -> dict[str, Any]:
    """The section as a plain dict (``{}`` when absent): :func:`locate_section`'s keys."""
    return locate_section(config).keys


def _refuse_a_near_miss(config: object) -> None:
    """Raise :class:`ConfigError` naming the first section whose name is near the plugin's.

    Only a bounded prefix of each table's keys is read (:data:`MAX_SCANNED_KEYS`).
    """
    if not isinstance(config, Mapping):
        return
    for top in _names(config, "the deployment config"):
        if _near(top, "l2evict") or _near(top, _SECTION_NAME):  # the name at the top level
            _refuse(top)
        if not _near(top, "plugins"):
            continue
        inner = config.get(top)
        if not isinstance(inner, Mapping):
            continue
        for name in _names(inner, top):
            if (top, name) != SECTION and _near(name, "l2evict"):
                _refuse(top, name)


def _names(table: Mapping[Any, Any], where: str) -> Iterator[str]:
    """The plain text of a bounded prefix of ``table``'s keys that could be near a name."""
    try:
        keys = list(islice(iter(table), MAX_SCANNED_KEYS))
    except Exception as error:  # a host's mapping whose iteration raises
        raise ConfigError(
            f"the keys of [{shown(where, 80)}] could not be read ({described(error, 200)}) to "
            f"look for [{_SECTION_NAME}]; fix: pass the deployment config as a plain mapping"
        ) from None
    for key in keys:
        if isinstance(key, str) and str.__len__(key) <= _NEAR_CHARS:
            yield str.__str__(key)  # a subclass's own methods are not called


def _near(name: str, wanted: str) -> bool:
    """Whether ``name`` is ``wanted`` but for case, width (NFKC), ``-``, ``_`` or blanks, and at
    most one letter missing, extra, changed, or two neighbours swapped.

    A name whose numbers differ is another plugin's, not a typo: ``l1evict``, ``l3evict`` and
    ``l2evict2`` hold their own plugins' sections (issue 46). A digit typed as a letter
    (``lwevict``) leaves no number to differ, and is a near miss still.
    """
    a, b = (
        re.sub(r"[-_\s]", "", unicodedata.normalize("NFKC", text).casefold())
        for text in (name, wanted)
    )
    numbers = _numbers(a)
    if numbers and numbers != _numbers(b):
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) <= 1:
            return True
        i, j = diff[0], diff[-1]
        return len(diff) == 2 and j == i + 1 and a[i] == b[j] and a[j] == b[i]
    short, long = sorted((a, b), key=len)
    return len(long) - len(short) == 1 and any(
        long[:i] + long[i + 1 :] == short for i in range(len(long))
    )


def _numbers(name: str) -> list[int]:
    """The numbers in ``name``, in order: ``l2evict2`` -> [2, 2] (any script's digits)."""
    return [int(run) for run in re.findall(r"\d+", name)]


def _refuse(*path: str) -> None:
    where = ".".join(_key(part) for part in path)
    raise ConfigError(
        f"no [{_SECTION_NAME}] section, but [{shown(where, 120)}] is near its name: the plugin "
        f"reads only [{_SECTION_NAME}], so that section's keys would be ignored and the "
        f"plugin would run with its defaults; fix: rename [{shown(where, 120)}] to "
        f"[{_SECTION_NAME}] (lower case, no '-' or '_'), or, if that section is another "
        f"plugin's, add an empty [{_SECTION_NAME}] to keep this plugin's defaults"
    )


def _key(part: str) -> str:
    """``part`` as TOML writes a key, every character past ASCII escaped (``\\u0456``, a
    Cyrillic i; ``\\u00a0``, a no-break space): "rename X" must not read as a no-op."""
    if _BARE.fullmatch(part):
        return part
    return '"' + "".join(map(_ascii, part)) + '"'


def _ascii(char: str) -> str:
    """One character of a quoted TOML key, escaped unless it is printable ASCII."""
    if char in '"\\':
        return "\\" + char
    if " " <= char <= "~":
        return char
    return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"


def _bounded_copy(section: Mapping[Any, Any]) -> dict[Any, Any]:
    """The section's keys and values, read only up to :data:`MAX_SECTION_KEYS` keys.

    The mappings on the way here are asked for one key each (``get``); only when the section
    is missing is a bounded prefix of their keys read, for a near miss of its name.
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


def on_error_raises(on_error: object) -> bool:
    """Whether an ``on_error`` value asks for a raise: the plain str ``"raise"``, not a subclass
    or anything else merely equal to it. The one spelling of the rule, for a section's raw
    value (before it is validated), a program's argument and a validated setting alike."""
    return type(on_error) is str and on_error == "raise"
