"""One start-up of the reference host, as its figures: what ``startup`` prints, declared once.

Torch-free, so that ``flare-l2evict schema startup`` and the parser never import torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, field_serializer

from .._report import ReclaimReport, StartupAudit
from ._json_output import Output
from ._plan import NAME_LIMIT, cut_name


class StartupReport(ReclaimReport):
    """The plugin's report, tensor names cut as ``plan`` cuts them (``names_cut`` counts them)."""

    names_cut: NonNegativeInt = Field(
        description=f"Tensor names in this report cut to {NAME_LIMIT} characters."
    )

    @classmethod
    def of(cls, report: ReclaimReport) -> StartupReport:
        data = report.model_dump()
        names = [data["source_tensor"], *(source["tensor"] for source in data["sources"])]
        if data["source_tensor"] is not None:
            data["source_tensor"] = cut_name(data["source_tensor"])
        for source in data["sources"]:
            source["tensor"] = cut_name(source["tensor"])
        cut = sum(name is not None and len(name) > NAME_LIMIT for name in names)
        return cls.model_validate({**data, "names_cut": cut})


class StartupArm(Output):
    """One start-up of the reference host (without, or with, the named plugins)."""

    plugins: tuple[str, ...] = Field(description="The plugins this start-up loaded.")
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
    job_evictions: tuple[Literal["weights", "stock", "none"], ...] = Field(
        description="Per race job, what its eviction reads: weights; stock, its own buffer "
        "(counted at stock's size on a CPU); none, b12x's seam gave it no eviction (CUDA only)."
    )
    race_winners: tuple[int, ...] = Field(
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
    report: ReclaimReport | None = Field(
        description="What the plugin's before_first_capture returned; null without it."
    )
    audit: StartupAudit | None = Field(
        description="What the plugin's startup_complete returned; null without it."
    )

    @field_serializer("report")
    def _names_cut(self, report: ReclaimReport | None) -> StartupReport | None:
        # Printed with names cut: a 1,000,000-character tensor name costs 80 characters.
        return None if report is None else StartupReport.of(report)

    @property
    def installed(self) -> bool:
        """The races read weights: credited, or kept for a host that sizes by measurement."""
        kept = self.report.unallocated_bytes if self.report is not None else 0
        return bool(self.reclaimed_bytes or self.credit_cut_bytes or kept)
