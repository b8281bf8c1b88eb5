"""What ``startup``, ``plan`` and ``check`` print with ``--json``: one pydantic model each.

Each command builds its figures, validates them into its model (an unknown or
missing key is a bug, caught by the tests that run every path) and prints the
model. ``flare-l2evict schema COMMAND`` prints the model's JSON Schema, and
:func:`field_tables` writes the field tables of ``docs/command-line.md``
(``scripts/json_fields.py`` rewrites them; ``tests/test_json_output.py``
holds them equal). Torch-free: ``schema`` answers in well under a second.

:data:`SCHEMA_VERSION` is the ``"schema"`` key of every object: it rises when
a key changes meaning (3: ``check`` without a checkpoint says ``installs if``
and the ``condition``, never ``installs``; 2: a CPU start-up's stock race jobs read
``stock``, not ``none``; every key is always present, null where it does not apply).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from .._report import ReclaimReport, StartupAudit
from ._plan import NAME_LIMIT

SCHEMA_VERSION: Final = 3
"""``"schema"`` of every JSON object the CLI prints: raised when a key changes meaning."""


def _version() -> Any:
    """The ``schema`` key's field (a fresh one per model: pydantic keeps each field's own)."""
    return Field(
        default=SCHEMA_VERSION,
        alias="schema",
        description="The version of these keys' meanings; it rises when one changes.",
    )


def _exit() -> Any:
    return Field(description="The command's exit code: 0 installs (or disabled), 1 falls back.")


class _Output(BaseModel):
    """Every key always present (null where it does not apply), and none other.

    A default (always None) is for a figure its producer leaves out where it does
    not apply; the printed object still carries the key.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class StartupReport(ReclaimReport):
    """The plugin's report, tensor names cut as ``plan`` cuts them (``names_cut`` counts them)."""

    names_cut: NonNegativeInt = Field(
        description=f"Tensor names in this report cut to {NAME_LIMIT} characters."
    )


class StartupArm(_Output):
    """One start-up of the reference host (without, or with, the named plugins)."""

    plugins: list[str] = Field(description="The plugins this start-up loaded.")
    device: str = Field(description="The device it ran on.")
    memory_bytes: NonNegativeInt = Field(description="Device memory (the profile's on a CPU).")
    l2_cache_bytes: NonNegativeInt = Field(description="The L2 (the profile's on a CPU).")
    race_jobs: NonNegativeInt = Field(description="b12x race jobs alive at once.")
    loaded_bytes: NonNegativeInt = Field(description="Bytes the checkpoint took on the device.")
    eviction_reserve_bytes: NonNegativeInt = Field(
        description="What a reserved KV budget sets aside for stock's buffers before the races: "
        "race jobs x stock buffer (a measured budget subtracts measured_race_bytes instead)."
    )
    eviction_storage_bytes: NonNegativeInt = Field(
        description="Eviction storage the race jobs allocated (measured on CUDA, counted on a CPU)."
    )
    eviction_measured: bool = Field(
        description="True: eviction storage read off the CUDA allocator; false: counted."
    )
    reclaimed_bytes: NonNegativeInt = Field(
        description="Bytes the KV allocator took of the credit (0 when kv_sizing is measured; "
        "never past free_at_hook_bytes)."
    )
    kv_sizing: Literal["reserved", "measured"] = Field(
        description="How the host sized its KV cache (--kv-sizing): reserved, memory - loaded - "
        "eviction_reserve_bytes + reclaimed_bytes; measured, memory - loaded - "
        "measured_race_bytes, nothing credited."
    )
    measured_race_bytes: NonNegativeInt | None = Field(
        description="For kv_sizing measured: what the races held, measured after them (the "
        "race peak on CUDA; on a CPU the eviction storage counted); null for reserved."
    )
    kv_budget_bytes: NonNegativeInt = Field(description="The KV cache budget.")
    kv_tokens: NonNegativeInt = Field(
        description="KV tokens: the whole tokens of the budget without the credit, plus the "
        "whole tokens of the credit (so plan's figure is exactly what the credit adds; it can "
        "be one less than the budget's bytes over the bytes per token)."
    )
    job_evictions: list[Literal["weights", "stock", "none"]] = Field(
        description="Per race job, what its eviction reads: weights; stock, its own buffer "
        "(counted at stock's size on a CPU); none, b12x's seam gave it no eviction (CUDA only)."
    )
    race_winners: list[int] = Field(
        description="On CUDA, each race job's winning candidate; empty on a CPU."
    )
    race_peak_bytes: NonNegativeInt | None = Field(
        description="On CUDA, the allocator's peak growth across the real races; null on a CPU."
    )
    free_after_races_bytes: NonNegativeInt | None = Field(
        description="On CUDA, the device's free memory right after the real races, the race "
        "jobs still alive (torch.cuda.mem_get_info); null on a CPU."
    )
    cute_guard_stand_in: bool = Field(
        description="b12x's no-compilation guard ran with a stand-in for the CuTe DSL's compiler."
    )
    free_at_hook_bytes: NonNegativeInt = Field(
        description="Memory free on the device when before_first_capture ran (the profile's "
        "memory less the checkpoint on a CPU; torch's free memory on CUDA): the most a credit "
        "can be backed by."
    )
    credit_cut_bytes: NonNegativeInt = Field(
        description="What the plugin's credit asked beyond free_at_hook_bytes, which the "
        "reference host did not take (reclaimed_bytes is what it took)."
    )
    out_of_memory: str | None = Field(
        description="Why this start-up's races run out of memory (stock's buffers do not fit "
        "the device; its KV budget and tokens are then 0), or null."
    )
    report: StartupReport | None = Field(
        description="What the plugin's before_first_capture returned; null without it."
    )
    audit: StartupAudit | None = Field(
        description="What the plugin's startup_complete returned; null without it."
    )


class StartupOutput(_Output):
    """``flare-l2evict startup --json``: the reference host's start-up without and with plugins."""

    schema_version: Literal[3] = _version()
    without: StartupArm = Field(description="The start-up without plugins.")
    with_: StartupArm = Field(alias="with", description="The start-up with the named plugins.")
    exit_code: Literal[0, 1] = _exit()


class PlanRank(_Output):
    """One rank's plan: what start-up would read and credit there."""

    rank: NonNegativeInt = Field(description="The rank.")
    tensor: str | None = Field(
        description=f"The first tensor read (cut to {NAME_LIMIT} characters), or null."
    )
    storage_bytes: NonNegativeInt = Field(description="Bytes of the storages read.")
    sources: list[str] = Field(description="Every tensor read, each cut as tensor is.")
    window_bytes: NonNegativeInt = Field(description="Bytes read per eviction.")
    reclaimed_bytes: NonNegativeInt = Field(description="What this rank alone would credit.")
    kv_tokens_gained: NonNegativeInt | None = Field(
        description="Whole KV tokens of reclaimed_bytes."
    )
    reason: str | None = Field(
        description="Why this rank credits 0 (it falls back, or is disabled by config), or null."
    )
    tensor_chars: NonNegativeInt | None = Field(description="tensor's full length, uncut.")
    names_cut: NonNegativeInt = Field(description="Names of this rank that were cut.")


class PlanOutput(_Output):
    """``flare-l2evict plan --json``: every rank's plan, from safetensors headers only."""

    schema_version: Literal[3] = _version()
    ranks: list[PlanRank] = Field(description="One plan per rank, in rank order.")
    agreed_reclaimed_bytes: NonNegativeInt = Field(
        description="What every rank credits: the minimum over ranks."
    )
    agreed_kv_tokens_gained: NonNegativeInt | None = Field(
        description="Whole KV tokens of agreed_reclaimed_bytes."
    )
    tensors: NonNegativeInt = Field(description="Tensors in the checkpoint files read.")
    files: NonNegativeInt = Field(description="Files read.")
    estimate: str | None = Field(
        description="How an unsharded checkpoint was split across ranks; null when exact."
    )
    name_limit: NonNegativeInt = Field(description="Characters a tensor name is cut to.")
    seconds: float = Field(description="Seconds the headers took to read and plan.")
    exit_code: Literal[0, 1] = _exit()


class CheckVersions(_Output):
    """Versions installed here."""

    torch: str | None = Field(description="torch's version, or null when not installed.")
    flashinfer_python: str | None = Field(
        alias="flashinfer-python", description="flashinfer-python's, or null when not installed."
    )


class CheckB12x(_Output):
    """The b12x that ``import b12x`` loads here, and whether its release is judged."""

    origin: str = Field(description="The release that provides it, in words.")
    provider: str = Field(description="standalone, FlashInfer, fork, or none.")
    distribution: str | None = Field(description="The distribution that owns it, or null.")
    version: str | None = Field(description="That distribution's version, or null.")
    path: str | None = Field(description="The file import b12x loads, or null.")
    judged: Literal["installs", "falls back"] | None = Field(
        description="The judged release table's verdict; null when it has no row."
    )


class CheckSupported(_Output):
    """What the plugin supports."""

    b12x: str = Field(description="The b12x releases.")
    torch: str = Field(description="The torch releases.")


class CheckPersistingL2(_Output):
    """The device's persisting-L2 carve-out: information, never a fault."""

    applicable: bool = Field(description="False off CUDA.")
    bytes: NonNegativeInt | None = Field(description="The carve-out, or null when not read.")
    via: str | None = Field(
        default=None, description="What read it, or why it was not read; null off CUDA."
    )
    fault: str | None = Field(
        default=None, description="A figure outside 0..L2, refused; else null."
    )


class CheckSeam(_Output):
    """b12x's seam, proved as start-up proves it."""

    verdict: Literal["installs", "falls back"] = Field(description="Whether it would install.")
    via: str | None = Field(description="The seam it would install through, or null.")
    extra_bindings: NonNegativeInt | None = Field(
        default=None,
        description="Extra bindings of stock's seam it would redirect; null for the fork.",
    )
    reason: str | None = Field(description="Why it falls back, or null.")


class CheckStockBuffer(_Output):
    """Stock's eviction buffer per race job."""

    bytes: NonNegativeInt = Field(description="Its bytes.")
    measured: bool = Field(description="True on CUDA (measured); false: max(2 x L2, 64 MiB).")


class CheckWindow(_Output):
    """The bytes read per eviction."""

    bytes: NonNegativeInt = Field(description="Its bytes.")
    setting: int | Literal["stock"] = Field(
        description="The config's window: 'stock', or the byte count it set."
    )


class CheckTensor(_Output):
    """One storage that would be read."""

    name: str = Field(description="Its first tensor's name.")
    bytes: NonNegativeInt = Field(description="Its bytes.")


class CheckStorageRead(_Output):
    """The storages this rank's checkpoint would be read from."""

    checked: bool = Field(description="False without a checkpoint (the other keys are null).")
    read_bytes: NonNegativeInt | None = Field(
        default=None, description="Bytes read per eviction, or null."
    )
    tensors: list[CheckTensor] | None = Field(
        default=None, description="The storages read, or null."
    )


class CheckRaces(_Output):
    """``check --races``: real b12x races, stock against the plugin, on this GPU."""

    races: NonNegativeInt = Field(description="Races per repeat.")
    repeats: NonNegativeInt = Field(description="Repeats of the race set.")
    agrees: bool = Field(description="The plugin changed no more winners than stock's re-run.")
    tolerance: float = Field(description="A winner costing at most this much more is a tie.")
    winners: dict[str, list[list[int]]] = Field(
        description="Per arm (stock, plugin, stock_rerun), per repeat, each race's winner."
    )
    changed: dict[str, NonNegativeInt] = Field(
        description="Per arm but stock, races whose winner changed beyond the tolerance."
    )
    max_regret: dict[str, float] = Field(
        description="Per arm, the worst cost of its winner over stock's, under stock's timings."
    )
    peak_bytes: dict[str, NonNegativeInt] = Field(
        description="Per arm, the CUDA allocator's peak growth over its races."
    )
    winner_latency_ratio: dict[str, list[float]] = Field(
        description="Per arm, its winner's latency over stock's winner's: lowest, highest."
    )
    reclaimed_bytes: NonNegativeInt = Field(description="What the plugin's arm reclaimed.")
    reason: str | None = Field(description="Why the plugin's arm did not run, or null.")
    seconds: float = Field(description="Seconds the races took.")
    cute_guard_stand_in: bool = Field(
        description="b12x's no-compilation guard ran with a stand-in for the CuTe DSL's compiler."
    )


class CheckOutput(_Output):
    """``flare-l2evict check --json``: start-up's own steps on this machine, nothing installed."""

    schema_version: Literal[3] = _version()
    device: str = Field(description="The device judged.")
    device_reason: str = Field(description="Why that device (given, or this machine's default).")
    flare_l2evict: str = Field(description="flare-l2evict's installed version.")
    versions: CheckVersions = Field(description="Versions installed here.")
    b12x: CheckB12x = Field(description="The b12x provider.")
    supported: CheckSupported = Field(description="What the plugin supports.")
    l2_cache_bytes: NonNegativeInt = Field(description="The L2.")
    l2_source: str = Field(description="Where the L2 came from (the device, or a profile).")
    race_jobs: NonNegativeInt = Field(description="Race jobs credited (the profile's).")
    persisting_l2: CheckPersistingL2 = Field(description="The persisting-L2 carve-out.")
    seam: CheckSeam = Field(description="b12x's seam.")
    stock_buffer: CheckStockBuffer = Field(description="Stock's buffer per race job.")
    window: CheckWindow = Field(description="The window.")
    storage_read: CheckStorageRead = Field(description="The storage that would be read.")
    verdict: Literal["installs", "installs if", "falls back", "disabled"] = Field(
        description="installs (this rank's checkpoint checked); installs if (no checkpoint "
        "given: it would install only if the weights meet condition, not checked); falls back; "
        "or disabled (by config: enabled = false)."
    )
    condition: str | None = Field(
        description="With verdict 'installs if': what this rank's resident weights must hold "
        "(the window they must cover), which check could not see without the checkpoint; "
        "else null."
    )
    credit_bytes: NonNegativeInt = Field(description="What start-up would credit.")
    reason: str | None = Field(description="Why the credit is 0, or null.")
    races: CheckRaces | None = Field(default=None, description="With --races; else null.")
    exit_code: Literal[0, 1] = _exit()


MODELS: dict[str, type[_Output]] = {
    "startup": StartupOutput,
    "plan": PlanOutput,
    "check": CheckOutput,
}
"""Each command's ``--json`` model, by command."""


def dumped(command: str, figures: Mapping[str, Any]) -> str:
    """``figures`` as ``command``'s model, printed (``schema`` is the model's own)."""
    model = MODELS[command].model_validate(dict(figures))
    # json.dumps, not pydantic's writer: non-ASCII in a tensor name stays \\u-escaped.
    return json.dumps(model.model_dump(mode="json", by_alias=True), indent=2)


_DESCRIPTIONS: dict[str, dict[str, str]] = {
    "StartupReport": {
        "device": "The device the races run on (cpu, cuda:N).",
        "rank": "This rank in the tensor-parallel job.",
        "world_size": "Ranks in the tensor-parallel job.",
        "mechanism": "How the eviction was installed: the fork's API, stock b12x's seam, or none.",
        "source_tensor": "The tensor the races read (the first storage's), or null.",
        "source_storage_bytes": "Distinct bytes of the storages read.",
        "sources": "Every storage the eviction reads, largest first.",
        "window_bytes": "Bytes read per eviction.",
        "stock_buffer_bytes": "Bytes of one stock buffer, which each race job no longer makes.",
        "race_jobs": "Race jobs held at once, each credited one stock buffer.",
        "reason": "Why nothing was reclaimed (set when reclaimed_bytes is 0), else null.",
    },
    "StartupAudit": {
        "mechanism": "How the eviction was installed (none: nothing was).",
        "device": "The credited device, or null.",
        "credited_bytes": "Bytes offered to the KV allocator at before_first_capture.",
        "devices": "What the races asked of the seam, per device.",
        "shortfall_bytes": "Bytes stock buffers allocated on the credited device while the "
        "credit stood (0 when the weights served every eviction).",
    },
    "DeviceAudit": {"device": "The device the races asked on."},
}
"""What the fields of the plugin's own models (its report and audit) hold, where the model
leaves it unsaid: the schema and the field tables say it for every key."""


def json_schema(command: str) -> dict[str, Any]:
    """The JSON Schema of what ``command --json`` prints, every key required and described."""
    schema = MODELS[command].model_json_schema(by_alias=True, mode="serialization")
    for name, node in [("", schema), *schema.get("$defs", {}).items()]:
        for key, prop in node.get("properties", {}).items():
            told = _DESCRIPTIONS.get(name, {}).get(key)
            if told is not None and "description" not in prop:
                prop["description"] = told
    for node in _objects(schema):
        node["required"] = list(node["properties"])  # model_dump writes every field
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _objects(node: object) -> Iterator[dict[str, Any]]:
    """Every object schema with properties under ``node``."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            yield node
        for value in node.values():
            yield from _objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value)


FIELDS_BEGIN = "<!-- json fields: written by scripts/json_fields.py; edit the models instead -->"
FIELDS_END = "<!-- json fields: end -->"
REGENERATE = "python scripts/json_fields.py"
"""The command that rewrites ``docs/command-line.md``'s field tables from the models."""


def with_field_tables(page: str) -> str:
    """``page`` with the text between :data:`FIELDS_BEGIN` and :data:`FIELDS_END` regenerated."""
    head, begin, rest = page.partition(FIELDS_BEGIN)
    _, end, tail = rest.partition(FIELDS_END)
    if not begin or not end:
        raise ValueError(f"the page has no {FIELDS_BEGIN} ... {FIELDS_END} section")
    return f"{head}{FIELDS_BEGIN}\n\n{field_tables()}\n\n{FIELDS_END}{tail}"


def field_tables() -> str:
    """The field tables of every command's JSON, as ``docs/command-line.md`` shows them."""
    parts = []
    for command in MODELS:
        schema = json_schema(command)
        about = _about(schema).partition("`: ")[2]
        parts += [f"### `flare-l2evict {command} --json`", about[:1].upper() + about[1:]]
        parts += _tables(schema)
    return "\n\n".join(parts)


def _about(node: Mapping[str, Any]) -> str:
    """A description's first paragraph, on one line, in Markdown's quotes."""
    text = str(node.get("description", "")).partition("\n\n")[0]
    return _cell(text)


def _tables(schema: Mapping[str, Any]) -> list[str]:
    """One table per object: the command's, then each model it holds, in order of first use."""
    defs: Mapping[str, Any] = schema.get("$defs", {})
    order: list[tuple[str, list[str]]] = [("", [""])]  # (def name, the paths that hold it)
    tables = []
    index = 0
    while index < len(order):
        name, paths = order[index]
        index += 1
        node = defs[name] if name else schema
        rows = ["| key | type | meaning |", "|---|---|---|"]
        for key, prop in node["properties"].items():
            about = _about(prop) or next((_about(defs[ref]) for ref, _ in _refs(prop)), "")
            if not about:
                raise ValueError(
                    f"{name or 'the top'}.{key} has no description: give its Field one (or, "
                    "for the plugin's report and audit, an entry in _DESCRIPTIONS)"
                )
            rows.append(f"| `{key}` | {_type(prop)} | {about} |")
            for ref, suffix in _refs(prop):
                held = [f"{p}.{key}{suffix}" if p else f"{key}{suffix}" for p in paths]
                known = next((entry for entry in order if entry[0] == ref), None)
                if known is None:
                    order.append((ref, held))
                else:
                    known[1].extend(p for p in held if p not in known[1])
        if name:
            where = ", ".join(f"`{p}`" for p in paths)
            tables.append(f"{where}: {_about(node)}\n\n" + "\n".join(rows))
        else:
            tables.append("\n".join(rows))
    return tables


def _refs(prop: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The models ``prop`` holds, each with the suffix of its path (``[]`` for an array's)."""
    if "$ref" in prop:
        yield prop["$ref"].rpartition("/")[2], ""
    for option in prop.get("anyOf", ()):
        yield from _refs(option)
    if "items" in prop:
        for ref, suffix in _refs(prop["items"]):
            yield ref, "[]" + suffix


def _type(prop: Mapping[str, Any]) -> str:
    """``prop``'s JSON type in words."""
    if "$ref" in prop:
        return f"object `{prop['$ref'].rpartition('/')[2]}`"
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " or ".join(f"`{json.dumps(value)}`" for value in prop["enum"])
    if "anyOf" in prop:
        return " or ".join(_type(option) for option in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"array of {_type(prop.get('items', {}))}"
    if kind == "object" and "additionalProperties" in prop:
        return f"object of {_type(prop['additionalProperties'])}"
    if kind == "integer" and "minimum" in prop:
        return f"integer >= {prop['minimum']}"
    return str(kind)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")
