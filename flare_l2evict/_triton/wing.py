"""The Triton wing as a start-up takes it: whether to install, the install kept to itself,
and one line and one report section for its outcome.

:func:`triton_wing` decides before anything changes: the setting, whether the host imported
Triton (the plugin never imports it: that and making its driver can cost seconds), the
eviction's device, and the proof (:func:`~.proof.prove_triton`). :class:`TritonWing` is
what the start-up installs after b12x's seam, through the same ``install(eviction, undo)``:
its undo steps land in the start-up's one list, before each change, and its own failures
(a patch that did not take, a driver that raises) are undone and recorded here, never
raised, so Triton falling back never takes b12x's install or its credit with it. An
interrupt (no ``Exception``) goes up as for b12x: its steps are registered, and the
start-up's restore puts them back.

Passive: nothing here imports the start-up or calls back into it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import torch

from .._eviction import WeightEviction
from .._log import say
from .._report import TRITON_STOCK_BYTES, TritonAudit, TritonReport
from .._settings import TRITON_DISABLED
from .._text import described
from .flush import copied, scratch_bytes
from .proof import STOCK, prove_triton
from .seam import TritonSeam

log = logging.getLogger("flare_l2evict")

Undo = list[Callable[[], None]]

SERVED_DEVICES = frozenset({"cuda"})
"""Device types whose ``do_bench`` flush the plugin serves: CUDA's driver is the one proven."""

SCRATCH_FACTOR = 1.0
"""The scratch, in L2s: the smallest write that kept stock's choices on an H100 (issue 47)."""

NOT_IMPORTED = (
    "triton is not imported in this process (the plugin never imports it itself); " + STOCK
)


def _stock(reason: str) -> str:
    """``reason`` as a line that says Triton's flush stays stock, once."""
    return reason if STOCK in reason else f"{reason}; {STOCK}"


class TritonWing:
    """The Triton side of one start-up: its seam (``None``: Triton stays stock) and why.

    ``section`` names the audit's field it fills (:meth:`audited`): the start-up reads it
    without knowing which library the wing is.
    """

    section = "triton"

    def __init__(
        self,
        seam: TritonSeam | None,
        reason: str,
        level: int,
        version: str | None = None,
    ) -> None:
        self.seam = seam
        self.reason = reason
        """The verdict: why Triton's flush stays stock, or what the proof found."""
        self.level = level
        """The level of the stock line: DEBUG (Triton not imported), INFO (by config, not
        CUDA), WARNING (a proof that failed)."""
        self.version = version
        self.installed = False
        """Whether both methods stood on the driver once the install was over."""
        self.failed: str | None = None
        """Why an install that began was undone (a WARNING)."""

    def install(self, eviction: WeightEviction, undo: Undo) -> None:
        """Install the seam, its undo steps in ``undo`` before each change; a failure is undone
        and recorded in :attr:`failed`, never raised (an interrupt is)."""
        seam = self.seam
        if seam is None:
            return
        first = len(undo)
        try:
            seam.install(eviction, undo)
        except Exception as error:
            failed = _stock(described(error, 300))
            # The seam undid what it set before raising; these run again harmlessly (each
            # puts back only where the plugin's method still stands), and stay registered.
            for step in reversed(undo[first:]):
                try:
                    step()
                except Exception as again:
                    failed += f"; its undo raised {described(again, 200)}"
            self.failed = failed
            return
        self.installed = True

    def audited(self) -> TritonAudit:
        """What the timing calls asked of the seam so far."""
        seam = self.seam
        if seam is None:
            return TritonAudit()
        counts = copied(seam.counts)
        return TritonAudit(
            installed=self.installed,
            calls=counts.calls,
            flushes=counts.flushes,
            captured=counts.captured,
            scratch_bytes=counts.scratch_bytes,
            stock_calls=counts.stock_calls,
            stock_bytes=counts.stock_bytes,
        )

    def report(self) -> TritonReport:
        """The report's section, as the install left it."""
        scratch = 0 if self.seam is None else self.seam.scratch
        reason = None if self.installed else (self.failed or self.reason)
        return TritonReport(
            installed=self.installed, reason=reason, version=self.version, scratch_bytes=scratch
        )

    def say(self, section: TritonReport) -> None:
        """The one line of Triton's outcome, as the report's ``section`` says it: installed
        (INFO), undone with b12x's install (INFO), or stock and why (its own level)."""
        if section.installed:
            say(
                log,
                logging.INFO,
                "flare_l2evict: triton: do_bench's flush reads the weights, then zeroes a "
                "scratch of %s bytes per call (stock: %s)",
                f"{section.scratch_bytes:,}",
                f"{TRITON_STOCK_BYTES:,}",
            )
            return
        level = logging.WARNING if self.failed else logging.INFO if self.installed else self.level
        say(log, level, "flare_l2evict: triton: %s", _stock(section.reason or self.reason))


def triton_wing(device: torch.device, l2_cache_bytes: int, enabled: bool) -> TritonWing:
    """Triton's side of a start-up whose b12x install goes ahead on ``device`` (L2 of
    ``l2_cache_bytes``): a wing with a proven seam, or one that leaves Triton stock and says
    why. Changes nothing; imports nothing that the host did not import."""
    if not enabled:
        return TritonWing(None, _stock(TRITON_DISABLED), logging.INFO)
    if "triton" not in sys.modules:
        return TritonWing(None, NOT_IMPORTED, logging.DEBUG)
    if device.type not in SERVED_DEVICES:
        return TritonWing(
            None, _stock(f"the weights are on {device}, not a CUDA device"), logging.INFO
        )
    try:  # the host's Triton, whatever shape it has: never b12x's fault
        verdict = prove_triton()
        proof = verdict.proof
        if proof is None:
            quiet = verdict.reason.startswith("triton is not installed")
            level = logging.INFO if quiet else logging.WARNING
            return TritonWing(None, _stock(verdict.reason), level)
        seam = TritonSeam(proof, scratch_bytes(l2_cache_bytes, SCRATCH_FACTOR))
    except Exception as error:
        why = f"proving Triton's seam raised {described(error, 300)}"
        return TritonWing(None, _stock(why), logging.WARNING)
    return TritonWing(seam, verdict.reason, logging.INFO, proof.version)
