"""What ``startup``, ``plan`` and ``check`` print with ``--json``: one model each.

Apart from the commands' modules, so that a command's flags and ``--help`` are read without
pydantic's import: this is imported only to print a command's JSON or to describe it
(``schema``, the generated docs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt

from .._inputs import ConfigFound
from .._json_output import Output, exit_field, schema_field
from .._persisting_l2 import PersistingL2
from .._plan import NAME_LIMIT, PlanRank
from .._preflight import (
    CheckB12x,
    CheckSeam,
    CheckStockBuffer,
    CheckStorageRead,
    CheckSupported,
    CheckVersions,
    CheckWindow,
)
from .._races_check import RaceAgreement
from .._startup_arm import StartupArm
from .._triton_check import CheckTriton


class StartupOutput(Output):
    """``flare-l2evict startup --json``: the reference host's start-up without and with plugins."""

    schema_version: Literal[3] = schema_field()
    config: ConfigFound = Field(description="The config read, and whether it holds the section.")
    without: StartupArm = Field(description="The start-up without plugins.")
    with_: StartupArm = Field(alias="with", description="The start-up with the named plugins.")
    exit_code: Literal[0, 1] = exit_field()


class PlanOutput(Output):
    """``flare-l2evict plan --json``: every rank's plan, from safetensors headers only."""

    schema_version: Literal[3] = schema_field()
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
    config: ConfigFound = Field(description="The config read, and whether it holds the section.")
    name_limit: NonNegativeInt = Field(
        default=NAME_LIMIT, description="Characters a tensor name is cut to."
    )
    seconds: float = Field(description="Seconds the headers took to read and plan.")
    exit_code: Literal[0, 1] = exit_field()


class CheckOutput(Output):
    """``flare-l2evict check --json``: start-up's own steps on this machine, nothing installed."""

    schema_version: Literal[3] = schema_field()
    device: str = Field(description="The device judged.")
    device_reason: str = Field(description="Why that device (given, or this machine's default).")
    flare_l2evict: str = Field(description="flare-l2evict's installed version.")
    config: ConfigFound = Field(description="The config read, and whether it holds the section.")
    versions: CheckVersions = Field(description="Versions installed here.")
    b12x: CheckB12x = Field(description="The b12x provider.")
    supported: CheckSupported = Field(description="What the plugin supports.")
    l2_cache_bytes: NonNegativeInt = Field(description="The L2.")
    l2_source: str = Field(description="Where the L2 came from (the device, or a profile).")
    race_jobs: NonNegativeInt = Field(description="Race jobs credited (the profile's).")
    persisting_l2: PersistingL2 = Field(description="The persisting-L2 carve-out.")
    seam: CheckSeam = Field(description="b12x's seam.")
    triton: CheckTriton = Field(description="Triton's do_bench flush, beside b12x's seam.")
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
    races: RaceAgreement | None = Field(default=None, description="With --races; else null.")
    exit_code: Literal[0, 1] = exit_field()
