"""Deployment config files: TOML, YAML or JSON, read bounded, into the mapping a host passes.

A server passes its config as ``runtime.config``; this reader serves the CLI's
``--config FILE``, the reference host and hosts that want the same checks
(exported as :func:`flare_l2evict.load_deployment_config`). The plugin a
server loads never imports it.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from itertools import islice
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._text import described_value, literal, shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


YAML_INSTALL = "pip install 'pyyaml>=6'"
"""How YAML configs get their reader: PyYAML itself, which works wherever the plugin came from
(``flare-l2evict[yaml]`` needs a published release, and there is none yet)."""

MAX_CONFIG_BYTES = 1 << 20
"""A deployment config over 1 MiB is a wrong file (a checkpoint, a log), not a config."""

_SUFFIXES = (".toml", ".yaml", ".yml", ".json")
_LISTED = 256
"""Entries of a directory passed as the config read for the config files it holds."""


def load_deployment_config(path: str | Path) -> dict[str, Any]:
    """Read a deployment config: TOML (``.toml``), YAML (``.yaml``/``.yml``) or JSON.

    YAML anchors and aliases are refused (an alias bomb, a self-alias). Raises
    :class:`ConfigError` naming the file and the problem in one bounded line.
    """
    if not isinstance(path, str | os.PathLike) or isinstance(path, bytes):
        raise ConfigError(
            f"the config path is {described_value(path, 80)}, not text or a path; fix: pass "
            "the deployment config file's path"
        )
    path = Path(path)
    where = shown(str(path))
    suffix = path.suffix.lower()
    text = _read_config_text(path, where)
    try:
        if suffix == ".toml":
            data: object = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ConfigError(
                    f"{where}: YAML configs need PyYAML; fix: {YAML_INSTALL}"
                ) from None
            data = yaml.load(text, Loader=_no_alias_loader(yaml, path))
        else:
            data = json.loads(text, object_pairs_hook=_unique_keys)
    except ConfigError:
        raise
    except Exception as error:  # the parsers' own error types differ; all mean "bad file"
        detail = " ".join(str(error)[:4096].split())
        raise ConfigError(
            f"{where}: cannot parse {suffix[1:]} ({shown(detail, 300)}); "
            "fix: correct the config file at the line named"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: the top level must be a table/mapping, not {type(data).__name__}"
        )
    return data


def _read_config_text(path: Path, where: str) -> str:
    """The text of a small regular file of a known kind, checked on the handle (opened
    without blocking) before a byte is read: a FIFO never blocks, a 3 GB file costs nothing."""
    fd, info = _open_config(path, where)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"{where}: not a regular file (a FIFO, socket or device); fix: pass the "
                "deployment config file itself"
            )
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{where}: {info.st_size:,} bytes, over the {MAX_CONFIG_BYTES:,} a deployment "
                "config may have; fix: pass the deployment config, not a checkpoint or log"
            )
        suffix = path.suffix.lower()
        if suffix not in (".toml", ".yaml", ".yml", ".json"):
            raise ConfigError(
                f"{where}: unknown config format '{shown(suffix or '(none)', 40)}'; "
                "fix: use a .toml, .yaml, .yml or .json file"
            )
        try:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
        except OSError as error:
            raise ConfigError(
                f"{where}: cannot read the config file ({shown(error.strerror or str(error), 200)})"
                "; fix: check the file and the disk it is on"
            ) from None
    if len(raw) > MAX_CONFIG_BYTES:  # it grew after the check
        raise ConfigError(
            f"{where}: over {MAX_CONFIG_BYTES:,} bytes; fix: pass the deployment config"
        )
    # UTF-32's little-endian mark begins with UTF-16's: the longer mark is asked first.
    for encoding, marks in (
        ("UTF-32", (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")),
        ("UTF-16", (b"\xff\xfe", b"\xfe\xff")),
    ):
        if raw.startswith(marks):
            raise ConfigError(
                f"{where}: {encoding} text (it starts with a {encoding} byte-order mark); fix: "
                "save the config as UTF-8"
            )
    try:
        # "utf-8-sig": a UTF-8 byte-order mark (Windows editors write one) is dropped, not
        # refused; TOML and JSON parsers would otherwise report it as a bad character.
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{where}: not UTF-8 text (byte {error.start:,}); fix: save the config as UTF-8"
        ) from None


def _open_config(path: Path, where: str) -> tuple[int, os.stat_result]:
    """A descriptor of ``path``, opened without blocking, and its ``fstat``; never a directory."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(
            f"{where}: no such config file; fix: pass an existing --config FILE"
        ) from None
    except IsADirectoryError:
        raise ConfigError(_directory(path, where)) from None
    except PermissionError:
        user = os.getuid() if hasattr(os, "getuid") else "unknown"  # no getuid on Windows
        raise ConfigError(
            f"{where}: permission denied: this process (user id {user}) may not read the "
            "config file; fix: make it readable by the user the server runs as (chmod a+r)"
        ) from None
    except (OSError, ValueError) as error:  # ValueError: a NUL inside the path
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigError(
            f"{where}: cannot open the config file ({shown(reason, 200)}); fix: pass a config "
            "file this process can open"
        ) from None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if stat.S_ISDIR(info.st_mode):
        os.close(fd)
        raise ConfigError(_directory(path, where))
    return fd, info


def _directory(path: Path, where: str) -> str:
    """Why a directory is refused, and the config files in it that the operator may have meant
    (of its first :data:`_LISTED` entries: a directory of a million files costs nothing)."""
    try:
        with os.scandir(path) as entries:
            # TOML first, as the docs write configs; a checkpoint's index is no config.
            names = sorted(
                (
                    entry.name
                    for entry in islice(entries, _LISTED)
                    if Path(entry.name).suffix.lower() in _SUFFIXES
                    and not entry.name.endswith(".safetensors.index.json")
                ),
                key=lambda name: (_SUFFIXES.index(Path(name).suffix.lower()), name),
            )
    except OSError:
        names = []
    if not names:
        fix = "pass the path of a config file (.toml, .yaml, .yml or .json), not of a directory"
    else:
        held = ", ".join(shown(name, 60) for name in names[:3]) + (" ..." if names[3:] else "")
        example = shown(str(path / names[0]))
        fix = f"pass the config file itself, as in --config {example} (it holds {held})"
    return f"{where}: is a directory, not a config file; fix: {fix}"


def _no_alias_loader(yaml: Any, path: Path) -> type:
    """A :class:`yaml.SafeLoader` that refuses anchors and aliases where the parser meets them."""

    class NoAliasLoader(yaml.SafeLoader):  # type: ignore[misc]  # yaml arrives untyped (Any)
        def compose_node(self, parent: object, index: object) -> object:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                line = event.start_mark.line + 1
                raise ConfigError(
                    f"{shown(str(path))}: yaml anchors/aliases are not allowed (line {line}); "
                    "fix: write the values out"
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> object:
            _unique_keys([(self.construct_object(key), None) for key, _ in node.value])
            return super().construct_mapping(node, deep=deep)

    return NoAliasLoader


def _unique_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A JSON or YAML mapping whose keys repeat is refused: the last one would win silently."""
    seen: set[object] = set()
    for key, _ in pairs:
        try:
            repeated = key in seen
            seen.add(key)
        except TypeError:  # an unhashable YAML key: the loader names it itself
            continue
        if repeated:
            # ValueError: read as a parse error, with the file named and its fix.
            raise ValueError(
                f"key {literal(key, 80)} appears twice in one mapping, and the last would win "
                "silently: keep one"
            )
    return dict(pairs)
