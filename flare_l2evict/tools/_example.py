"""``flare-l2evict example --out DIR``: files to try every command of the README and docs/ on.

The embedded example checkpoint three ways (one file; an index and two
shards; one file per tensor-parallel rank), the README's deployment config in
TOML, YAML and JSON, and ``COMMANDS.md``, the commands to try on them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ._all_or_nothing import write_all
from ._config_file import YAML_INSTALL
from ._wrapping import wrap

CONFIG_TOML = """\
[plugins.l2evict]
enabled = true                      # false: installed but inactive
window = "stock"                    # bytes read per eviction: "stock" = max(2 x L2, 64 MiB),
                                    # or a byte count / size such as "256MiB"
exclude = ["*.embed_tokens.*"]      # tensor-name globs never to read
on_error = "fallback"               # or "raise": abort start-up instead of falling back
"""
"""The README's config section, word for word (a test holds the two equal)."""

CONFIG = {
    "plugins": {
        "l2evict": {
            "enabled": True,
            "window": "stock",
            "exclude": ["*.embed_tokens.*"],
            "on_error": "fallback",
        }
    }
}
"""The same section as data: what ``deploy.yaml`` and ``deploy.json`` hold."""

CONFIG_YAML = """\
plugins:
  l2evict:
    enabled: true
    window: stock
    exclude: ["*.embed_tokens.*"]
    on_error: fallback
"""

RANKS = 2
"""Ranks of the per-rank files: the example split as ``plan --tp 2`` estimates it."""


TRY: tuple[tuple[str, str], ...] = (
    (
        "Start-up on the single file, without and with the plugin, with a config:",
        "startup {dir}/model.safetensors --plugin l2evict --config {dir}/deploy.json",
    ),
    (
        "Start-up on the index and its two shards (startup, plan and check all take a file, "
        "its shards or its index):",
        "startup {dir}/model.safetensors.index.json --plugin l2evict",
    ),
    (
        "Preflight on this machine (exit 0: it would install; 1: it would fall back):",
        "check {dir}/model.safetensors --config {dir}/deploy.toml",
    ),
    (
        "Plan from headers alone, on the index and its two shards:",
        "plan {dir}/model.safetensors.index.json",
    ),
    (
        "On the per-rank files: on gb202 (the default profile) each rank's shard is short "
        "of the 256 MiB window, so each says why, the ranks agree on 0, and plan exits 1:",
        "plan {dir}/rank0.safetensors {dir}/rank1.safetensors --tp 2 --per-rank",
    ),
    (
        "An even TP2 split of the single file (an estimate), where a 16 MiB L2 makes the "
        "window fit:",
        "plan {dir}/model.safetensors --tp 2 --l2-mib 16",
    ),
)
"""What ``COMMANDS.md`` suggests: why, and the command with ``{dir}`` for the directory."""


def commands_note(out: str) -> str:
    """``COMMANDS.md``: the commands of :data:`TRY` on the directory as the user named it."""
    where = shlex.quote(out.rstrip("/") or "/")
    lines = [
        "# Commands to try on these files",
        "",
        f"Written by `flare-l2evict example --out {where}`. Run them from the directory",
        "you ran that in. A command's table goes to stdout; the plugin's own lines (the",
        "credit, the audit) go to the log, on stderr.",
    ]
    for why, command in TRY:
        lines += ["", *wrap(why, 80), "", "    flare-l2evict " + command.format(dir=where)]
    lines += [
        "",
        "`deploy.toml`, `deploy.yaml` and `deploy.json` hold the same settings (YAML needs",
        f"`{YAML_INSTALL}`).",
        "",
    ]
    return "\n".join(lines)


EXAMPLE_FILES = (
    "model.safetensors",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    *(f"rank{rank}.safetensors" for rank in range(RANKS)),
    "deploy.toml",
    "deploy.yaml",
    "deploy.json",
    "COMMANDS.md",
)
"""Every file :func:`write_example` writes, and nothing else."""


def _refuse_links(out: Path) -> None:
    """Refuse, before writing anything, a name that is a link or not a plain file.

    Writing through a symlink left in ``out`` would overwrite a file outside it.
    """
    from .._errors import L2EvictError
    from .._text import shown

    for name in EXAMPLE_FILES:
        path = out / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise L2EvictError(
                f"--out {shown(str(out))}: {shown(name)} there is a symlink or not a plain "
                "file, and the example would write through it; nothing written; fix: remove "
                "it, or name a new directory"
            )


def write_example(
    out: Path, window_bytes: int, *, shown_as: str | None = None, settle: bool = False
) -> list[Path]:
    """Write every example file into ``out`` (made if missing) and return their paths.

    All or nothing (:func:`~flare_l2evict.tools._all_or_nothing.write_all`):
    interrupted or failed, ``out`` is left as it was, and the error says so.
    Only the files named here are written; others in ``out`` are left alone.
    ``shown_as`` is how ``COMMANDS.md`` names the directory (default: ``out``);
    ``settle``: :func:`~flare_l2evict.tools._all_or_nothing.write_all`'s.
    Nothing outside ``out`` changes: a link found at a name is moved aside as
    a directory entry, never followed.
    """
    from .reference_host._example import example_specs, safetensors_head

    specs = example_specs(window_bytes)
    half = (len(specs) + 1) // 2
    weight_map: dict[str, str] = {}
    files: list[tuple[str, bytes, int | None]] = [("model.safetensors", *safetensors_head(specs))]
    for number, chunk in enumerate((specs[:half], specs[half:]), 1):
        name = f"model-{number:05d}-of-00002.safetensors"
        files.append((name, *safetensors_head(chunk)))
        weight_map |= dict.fromkeys((tensor for tensor, _, _ in chunk), name)
    index = json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1) + "\n"
    files.append(("model.safetensors.index.json", index.encode(), None))
    # Each rank's shard as plan's even-split estimate makes it: dim 0 halved where it
    # divides by the rank count, the tensor replicated otherwise.
    shard = [
        (name, dtype, (shape[0] // RANKS, *shape[1:]) if shape[0] % RANKS == 0 else shape)
        for name, dtype, shape in specs
    ]
    files += [(f"rank{rank}.safetensors", *safetensors_head(shard)) for rank in range(RANKS)]
    for name, text in (
        ("deploy.toml", CONFIG_TOML),
        ("deploy.yaml", CONFIG_YAML),
        ("deploy.json", json.dumps(CONFIG, indent=2) + "\n"),
        ("COMMANDS.md", commands_note(shown_as or str(out))),
    ):
        files.append((name, text.encode("utf-8"), None))
    # The links are refused once DIR exists: a refusal then removes a DIR it made.
    write_all(out, files, check=_refuse_links, settle=settle)
    return [out / name for name, _, _ in files]
