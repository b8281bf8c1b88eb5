"""What every ``--json`` output shares: its base model, its ``"schema"`` key, how it prints.

Each command declares its output once, as a pydantic model in ``cli/_outputs.py``
(``startup``: :class:`~.cli._outputs.StartupOutput` of two reference-host arms; ``plan``:
:class:`~.cli._outputs.PlanOutput`; ``check``: :class:`~.cli._outputs.CheckOutput`), loaded
only by the command that prints it, and prints it with :func:`printed`.
``flare-l2evict schema COMMAND`` prints :func:`json_schema` of the same model, and
``scripts/command_line_docs.py`` writes docs/command-line.md's field tables from it.
Torch-free: ``schema`` answers in well under a second.

:data:`SCHEMA_VERSION` is the ``"schema"`` key of every object: it rises when a key changes
meaning (3: ``check`` without a checkpoint says ``installs if`` and the ``condition``,
never ``installs``; 2: a CPU start-up's stock race jobs read ``stock``, not ``none``;
every key is always present, null where it does not apply).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from .._report import DeviceAudit, ReclaimReport, StartupAudit, TritonAudit, TritonReport

SCHEMA_VERSION: Final = 3
"""``"schema"`` of every JSON object the CLI prints: raised when a key changes meaning."""


def schema_field() -> Any:
    """The ``schema`` key's field (a fresh one per model: pydantic keeps each field's own)."""
    return Field(
        default=SCHEMA_VERSION,
        alias="schema",
        description="The version of these keys' meanings; it rises when one changes.",
    )


def exit_field() -> Any:
    return Field(description="The command's exit code: 0 installs (or disabled), 1 falls back.")


class Output(BaseModel):
    """Every key always present (null where it does not apply), and none other.

    A default (always None) is for a figure its producer leaves out where it does not
    apply; the printed object still carries the key.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def printed(output: BaseModel) -> str:
    """``output`` as the command prints it (``schema`` is the model's own)."""
    # json.dumps, not pydantic's writer: non-ASCII in a tensor name stays \\u-escaped.
    return json.dumps(output.model_dump(mode="json", by_alias=True), indent=2)


_DESCRIPTIONS: dict[type[BaseModel], dict[str, str]] = {
    ReclaimReport: {
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
    StartupAudit: {
        "mechanism": "How the eviction was installed (none: nothing was).",
        "device": "The credited device, or null.",
        "credited_bytes": "Bytes offered to the KV allocator at before_first_capture.",
        "devices": "What the races asked of the seam, per device.",
        "shortfall_bytes": "Bytes stock buffers allocated on the credited device while the "
        "credit stood (0 when the weights served every eviction).",
    },
    DeviceAudit: {"device": "The device the races asked on."},
    TritonReport: {
        "installed": "Whether Triton's do_bench (every @triton.autotune kernel too) flushes by "
        "reading the weights, then zeroing a scratch, while this start-up is installed.",
        "reason": "Why Triton's flush stays stock, or null when installed.",
        "version": "The Triton version proven, or null.",
        "scratch_bytes": "Bytes of the scratch each served do_bench call makes and zeroes "
        "(one L2); never credited, a peak avoided.",
        "stock_bytes": "What stock Triton allocates for each do_bench call's flush.",
    },
    TritonAudit: {
        "installed": "Whether the plugin's flush stood on Triton's driver in this start-up.",
        "calls": "do_bench calls whose flush buffer was the plugin's scratch.",
        "flushes": "Flushes served: the weights read, then the scratch zeroed.",
        "captured": "Of those, flushes captured into a CUDA graph.",
        "scratch_bytes": "Most bytes one served do_bench call allocated for its flush.",
        "stock_calls": "do_bench calls left to the driver's own flush (another device, or "
        "after the start-up ended).",
        "stock_bytes": "Most bytes one of those stock calls allocated.",
    },
}
"""What the fields of the plugin's own models (its report and audit) hold, where the model
leaves it unsaid: the schema and the field tables say it for every key. Keyed by the models
themselves, and each name checked against its model's fields when a schema is made
(:class:`_Described`): a field renamed there fails every schema, never drops its words."""


class _Described(GenerateJsonSchema):
    """Pydantic's schema, with :data:`_DESCRIPTIONS` written into each model's properties (and
    into a subclass's, as ``startup``'s report of the plugin's own)."""

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        made = super().model_schema(schema)
        for base, texts in _DESCRIPTIONS.items():
            if not issubclass(schema["cls"], base):
                continue
            for name, text in texts.items():
                if name not in base.model_fields:
                    raise LookupError(f"_DESCRIPTIONS names {base.__name__}.{name}: no such field")
                prop = made["properties"][name]
                if "description" in prop:  # the model's own words: one place says it
                    raise LookupError(f"{base.__name__}.{name} is described twice")
                prop["description"] = text
        return made


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema of what ``model`` prints, every key required and described."""
    schema = model.model_json_schema(
        by_alias=True, mode="serialization", schema_generator=_Described
    )
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
