"""What the plugin hands the KV allocator, and what an operator reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator


@dataclass(frozen=True)
class Wording:
    """How a line names the caller's side, a host's hooks or a program's ``with`` block
    (``race_jobs``' ``{}``: the number)."""

    began: str
    ends: str
    race_jobs: str
    resident: str
    tensors: str
    loaded: str
    by_name: str
    races: str
    busy: str
    """A call refused while another start-up is active (``{how}``, ``{active}``)."""
    kind: str = "a flare host's hook"
    """What holds a start-up of these words, in a line that names it to another caller."""


HOST = Wording(
    "before_first_capture",
    "startup_complete",
    "set runtime.race_jobs to {}",
    "resident_tensors() must return the tensors the model keeps resident",
    "resident_tensors()",
    "the host must call before_first_capture after the checkpoint is loaded onto the device",
    "the host must return this rank's checkpoint tensors, by name",
    "if this host races, call startup_complete after its last race (a race after it "
    "allocates stock buffers out of the KV cache's memory)",
    "{how} while a start-up is active ({active}); this call credits 0 and changes nothing; "
    "fix: call before_first_capture once per start-up, and startup_complete before starting "
    "again",
)
PROGRAM = Wording(
    "the evicting_from block's entry",
    "the end of the evicting_from block",
    "pass race_jobs={}",
    "pass evicting_from the tensors the program keeps resident",
    "evicting_from's tensors",
    "pass evicting_from the tensors the program keeps resident, once they are loaded",
    "pass evicting_from the tensors the program keeps resident, by name",
    "if this program races, run its races inside the block (a race after it allocates "
    "a stock buffer of its own)",
    "evicting_from: a start-up is active in this process ({active}: a flare host's, or another "
    "evicting_from block); this block credits 0 and changes nothing; fix: run the block outside "
    "any other start-up",
    "an evicting_from block",
)


TRITON_STOCK_BYTES = 268_435_456
"""What stock Triton's CUDA driver allocates for each timing call's flush, on every GPU."""

TRITON_WITHOUT_B12X = (
    "no b12x install stands in this start-up (Triton's flush is served only beside one); "
    "Triton's flush stays stock"
)


class TritonReport(BaseModel):
    """Whether Triton's autotuner flushed by reading the weights in this start-up, or why not.

    Never credited: the scratch is made per timing call and freed after it, as stock's buffer
    is, and no host reserved memory for it. The saving is a peak avoided.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    installed: bool = False
    reason: str | None = TRITON_WITHOUT_B12X
    version: str | None = None
    scratch_bytes: NonNegativeInt = 0
    stock_bytes: NonNegativeInt = TRITON_STOCK_BYTES

    def stock(self, reason: str = TRITON_WITHOUT_B12X) -> TritonReport:
        """This section once the b12x install it rode on is gone: stock, and why (a section
        that never installed keeps its own reason)."""
        if not self.installed:
            return self
        return self.model_copy(update={"installed": False, "reason": reason})


class TritonAudit(BaseModel):
    """What Triton's timing calls asked of the plugin's flush between the hook and the end."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    installed: bool = False
    calls: NonNegativeInt = 0
    flushes: NonNegativeInt = 0
    captured: NonNegativeInt = 0
    scratch_bytes: NonNegativeInt = 0
    stock_calls: NonNegativeInt = 0
    stock_bytes: NonNegativeInt = 0

    def summary(self) -> str:
        """The audit line's Triton part ("" when no timing call was served)."""
        if not self.calls:
            return ""
        stock = f", {self.stock_calls} left stock" if self.stock_calls else ""
        return (
            f"; triton: {self.calls} timing calls flushed by the weights ({self.flushes} "
            f"flushes{stock}), at most {self.scratch_bytes:,} bytes each against stock's "
            f"{TRITON_STOCK_BYTES:,}"
        )


class RegionRead(BaseModel):
    """One storage the eviction reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor: str = Field(description="First name, in sort order, of the region's largest storage.")
    storage_bytes: NonNegativeInt = Field(
        description="Distinct bytes of the region (storages overlapping in memory count once)."
    )
    read_bytes: NonNegativeInt = Field(default=0, description="Bytes the eviction reads of it.")


class ReclaimReport(BaseModel):
    """The outcome of ``before_first_capture`` on one rank.

    Invariant the KV allocator relies on: ``reclaimed_bytes`` is never more
    than the eviction storage the races no longer allocate on this rank, and
    under tensor parallelism it is the same on every rank. When it is 0,
    ``reason`` says why.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str
    rank: NonNegativeInt = 0
    world_size: int = Field(default=1, ge=1)
    reclaimed_bytes: NonNegativeInt = Field(
        description="Bytes the KV allocator may add to its budget; agreed across ranks."
    )
    local_reclaimed_bytes: NonNegativeInt = Field(
        default=0, description="What this rank alone saved, before agreement."
    )
    mechanism: Literal["fork", "stock-seam", "none"]
    source_tensor: str | None = None
    source_storage_bytes: NonNegativeInt = 0
    sources: tuple[RegionRead, ...] = ()
    window_bytes: NonNegativeInt = 0
    read_kernel: Literal["triton", "torch"] | None = Field(
        default=None, description="What reads the window: the Triton kernel, or torch's reduction."
    )
    stock_buffer_bytes: NonNegativeInt = 0
    race_jobs: NonNegativeInt = 0
    reason: str | None = None
    fallback_ranks: dict[int, str] = Field(
        default_factory=dict, description="Ranks that reclaimed nothing, with their reasons."
    )
    allocator_error: str | None = Field(
        default=None,
        description="What kv_allocator.add_reclaimed raised after being offered the credit. "
        "The credit may have been applied, so the eviction stays until startup_complete.",
    )
    seconds: dict[str, float] = Field(
        default_factory=dict, description="Wall time of each step of the hook, and the total."
    )
    kv_sizing: Literal["reserved", "measured"] = Field(
        default="reserved",
        description="How the host sizes its KV cache (runtime.kv_sizing): 'reserved' takes the "
        "credit; 'measured' is credited nothing, its measurement sees the bytes itself.",
    )
    unallocated_bytes: NonNegativeInt = Field(
        default=0,
        description="For a 'measured' host: the eviction storage the races no longer allocate "
        "(agreed across ranks), which its measurement of free memory already holds.",
    )
    device_free_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Memory free to torch on this rank's CUDA device when the hook ran: the "
        "driver's free memory plus what torch's caching allocator held unused. The credit "
        "never exceeds it; null off CUDA.",
    )
    uncut_credit_bytes: NonNegativeInt | None = Field(
        default=None,
        description="This rank's credit before it was cut to device_free_bytes (more than "
        "the device had free); null when it was not cut.",
    )
    triton: TritonReport = Field(
        default_factory=TritonReport,
        description="Triton's autotuner flush in this start-up: never credited.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ReclaimReport:
        if self.reclaimed_bytes == 0 and not self.reason:
            raise ValueError("a report that reclaims nothing must say why (reason)")
        if self.reclaimed_bytes > 0 and self.mechanism == "none":
            raise ValueError("reclaimed bytes need a mechanism")
        if self.rank >= self.world_size:
            raise ValueError("rank must be below world_size")
        return self

    def summary(self) -> str:
        """One line for the start-up log."""
        if self.unallocated_bytes:
            return (
                f"installed on {self.device} (rank {self.rank}) via {self.mechanism}: races read "
                f"{self.source_tensor!r:.200} ({self.window_bytes:,}-byte window, "
                f"{self.read_kernel} read) instead of {self.race_jobs} x "
                f"{self.stock_buffer_bytes:,}-byte buffers; {self.reason}"
            )
        if self.reclaimed_bytes == 0:
            return f"reclaimed 0 bytes on {self.device} (rank {self.rank}): {self.reason}"
        line = (
            f"reclaimed {self.reclaimed_bytes:,} bytes on {self.device} (rank {self.rank}) "
            f"via {self.mechanism}: races read {self.source_tensor!r:.200} "
            f"({self.source_storage_bytes:,}-byte storage, {self.window_bytes:,}-byte window, "
            f"{self.read_kernel} read) "
            f"instead of {self.race_jobs} x {self.stock_buffer_bytes:,}-byte buffers"
        )
        if self.uncut_credit_bytes is not None:
            line += (
                f"; CUT from {self.uncut_credit_bytes:,} bytes to the "
                f"{self.device_free_bytes or 0:,} bytes free to torch on {self.device} when the "
                "hook ran (stock's buffers for that many race jobs could not all have existed)"
            )
        if self.allocator_error:
            line += (
                f"; kv_allocator.add_reclaimed RAISED {self.allocator_error} after the offer, so "
                "the credit may have been applied: the eviction stays until startup_complete"
            )
        return line


class DeviceAudit(BaseModel):
    """What b12x's races asked of the seam on one device while the plugin was installed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str
    requested: NonNegativeInt = Field(description="Evictions b12x asked for (enabled calls).")
    served_by_weights: NonNegativeInt = Field(description="Of those, served by the weights.")
    stock_buffers: NonNegativeInt = Field(description="Stock buffers made instead (fallbacks).")
    stock_bytes: NonNegativeInt = Field(description="Bytes those stock buffers allocated.")


class StartupAudit(BaseModel):
    """What really happened between ``before_first_capture`` and ``startup_complete``.

    ``shortfall_bytes``: what stock buffers allocated on the credited device while
    the credit stood (memory promised to the KV allocator); 0 when the weights
    served every eviction.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mechanism: Literal["fork", "stock-seam", "none"]
    device: str | None = None
    credited_bytes: NonNegativeInt = 0
    race_jobs: NonNegativeInt = Field(
        default=0, description="The race jobs held at once that the credit counted."
    )
    peak_alive: NonNegativeInt | None = Field(
        default=None,
        description="Most evictions handed to b12x and not yet dropped, at once "
        "(None for the fork's API, whose calls the plugin cannot see).",
    )
    unused_credit_bytes: NonNegativeInt = Field(
        default=0,
        description="(race_jobs - peak_alive) x stock buffer: credit for race jobs that never "
        "held an eviction at the same time; lower race_jobs to peak_alive (when peak_alive is "
        "0, no race ran under the plugin and the summary says so instead).",
    )
    allocator_error: str | None = Field(
        default=None, description="What kv_allocator.add_reclaimed raised after the offer."
    )
    counted: bool = Field(
        default=True, description="False for the fork's API, whose calls the plugin cannot see."
    )
    devices: tuple[DeviceAudit, ...] = ()
    shortfall_bytes: NonNegativeInt = 0
    refused: str | None = Field(
        default=None, description="Why this call ended nothing (another start-up is active)."
    )
    fallback_reason: str | None = Field(
        default=None,
        description="Why the eviction stopped reading the weights mid-start-up (the host freed, "
        "moved or re-pointed them); the races used stock buffers from then on.",
    )
    device_free_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Memory free to torch on the credited CUDA device when the hook ran; the "
        "credit never exceeded it. Null off CUDA, or when nothing was credited.",
    )
    uncut_credit_bytes: NonNegativeInt | None = Field(
        default=None,
        description="The credit before it was cut to device_free_bytes; null when it was not cut.",
    )
    triton: TritonAudit = Field(
        default_factory=TritonAudit,
        description="What Triton's autotuner asked of the plugin's flush; never credited.",
    )

    @property
    def warns(self) -> bool:
        """Whether the audit line is a WARNING: a shortfall, a fallback, unused credit or an
        allocator error."""
        return bool(
            self.shortfall_bytes
            or self.unused_credit_bytes
            or self.allocator_error
            or self.fallback_reason
        )

    def summary(self, words: Wording = HOST) -> str:
        """One line for the start-up log (``words``: a program's block names its own)."""
        if self.refused:
            return self.refused
        if self.mechanism == "none":
            return "nothing was installed; stock b12x ran its races"
        if not self.counted:
            return (
                f"credited {self.credited_bytes:,} bytes{self._cut()} on {self.device} via the "
                "fork's API; its race evictions are not visible to the plugin"
            ) + self.triton.summary()
        parts = [
            f"{d.device}: {d.requested} evictions asked, {d.served_by_weights} served by weights, "
            f"{d.stock_buffers} stock buffers ({d.stock_bytes:,} bytes)"
            for d in self.devices
        ] or [f"{self.device}: no evictions asked"]
        head = (
            f"credited {self.credited_bytes:,} bytes{self._cut()} on {self.device} for "
            f"{self.race_jobs} race jobs; at most {self.peak_alive} evictions alive at once; "
            + "; ".join(parts)
        )
        if self.allocator_error:
            head += (
                f"; kv_allocator.add_reclaimed RAISED {self.allocator_error} after the offer "
                "(the credit may have been applied; the eviction stayed installed)"
            )
        if self.unused_credit_bytes and not self.peak_alive:
            head += self._never_read(words)
        elif self.unused_credit_bytes:
            head += (
                f"; UNUSED CREDIT {self.unused_credit_bytes:,} bytes: {self.race_jobs} race jobs "
                f"credited but at most {self.peak_alive} held an eviction at once; fix: "
                + words.race_jobs.format(self.peak_alive)
            )
        if self.fallback_reason:
            head += f"; FELL BACK to stock mid-start-up: {self.fallback_reason}"
        if self.shortfall_bytes:
            head += f"; SHORTFALL {self.shortfall_bytes:,} bytes of the credit were used"
        return head + self.triton.summary()

    def _cut(self) -> str:
        """Where the credit was cut to the memory free on the device, the figures (else "")."""
        if self.uncut_credit_bytes is None:
            return ""
        return (
            f" (CUT from {self.uncut_credit_bytes:,} to the {self.device_free_bytes or 0:,} "
            "bytes free to torch when the hook ran)"
        )

    def _never_read(self, words: Wording) -> str:
        """Why no eviction ever read the weights (peak 0), in words true to the counts: races
        that all got stock buffers, a fallback before any race, or no race at all."""
        # The audit has nothing to hold race_jobs to, and 0 race jobs would be no fix (a
        # host that races needs at least one).
        unconfirmed = f"the audit cannot confirm the {self.race_jobs} race jobs credited"
        asked = sum(device.requested for device in self.devices)
        if asked:
            return (
                f"; NO EVICTION READ THE WEIGHTS: the races asked {asked:,} evictions, each "
                f"served by a stock buffer (counts per device before), so {unconfirmed}"
            )
        if self.fallback_reason:
            # Races after the fallback are stock's own, unseen: SHORTFALL counts them.
            return (
                f"; NO RACE RAN BEFORE THE FALLBACK: no eviction was asked between "
                f"{words.began} and the fallback (FELL BACK), so {unconfirmed}"
            )
        return (
            f"; NO RACE RAN: no eviction was asked between {words.began} and "
            f"{words.ends}, so no race used the {self.credited_bytes:,} credited bytes "
            f"and {unconfirmed}; " + words.races
        )
