"""One start-up, end to end: check, choose, build and install, credit, agree, report.

Each step returns a frozen value; :meth:`L2EvictStartup.run` reads as the flow.
The installation itself is owned by :mod:`flare_l2evict._install`; this module
holds only the report of the start-up in progress.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ._agree import Agreement, RankOutcome, agree, settings_digest
from ._credit import Credit, credit
from ._errors import L2EvictError
from ._install import Installation, active_installation, install, restore
from ._report import ReclaimReport, StartupAudit
from ._runtime import Placement, RuntimeFacts, placement, read_runtime
from ._seam import SeamProof, fork_function, measure_stock_buffer, prove_seam
from ._settings import L2EvictSettings, settings_from_config
from ._source import choose_source
from ._window import device_l2_bytes, stock_buffer_bytes

log = logging.getLogger("flare_l2evict")


@dataclass(frozen=True)
class Sizes:
    """The byte figures of this device that the credit rests on, and the seam they came from.

    ``proof`` is ``None`` only when the fork's API is used (its buffer is the formula).
    """

    l2_cache_bytes: int
    window_bytes: int
    stock_buffer_bytes: int
    race_jobs: int
    proof: SeamProof | None


@dataclass(frozen=True)
class Installed:
    """What this rank installed and may credit (``credit.nbytes == 0``: restored)."""

    installation: Installation | None
    credit: Credit


def measure_sizes(facts: RuntimeFacts, settings: L2EvictSettings) -> Sizes:
    """L2, window and stock's real per-job buffer on ``facts.device``.

    On CUDA stock's buffer is measured through the proven seam (allocated
    once, then freed); elsewhere it is the formula. Raises
    :class:`~flare_l2evict.InstallError` when b12x fails the proof and the
    fork's API is absent.
    """
    l2 = facts.l2_cache_bytes
    if l2 is None:
        l2 = device_l2_bytes(facts.device)
    window = settings.window_bytes(l2)
    if fork_function() is not None:
        return Sizes(l2, window, stock_buffer_bytes(l2), facts.race_jobs, None)
    proof = prove_seam()
    stock = measure_stock_buffer(proof.original, facts.device, l2)
    return Sizes(l2, window, stock.nbytes, facts.race_jobs, proof)


def install_and_credit(facts: RuntimeFacts, settings: L2EvictSettings, sizes: Sizes) -> Installed:
    """Choose the source, install the eviction, and compute the credit in one place.

    Invariant: when the returned credit is 0, nothing is left installed.
    """
    choice = choose_source(
        facts.resident_tensors(), facts.device, sizes.window_bytes, settings.exclude
    )
    installation = install(choice, sizes.proof, sizes.stock_buffer_bytes)
    granted = credit(
        installed=not installation.restored,
        race_jobs=sizes.race_jobs,
        stock_buffer_bytes=sizes.stock_buffer_bytes,
        window_bytes=sizes.window_bytes,
        read_bytes=installation.read_bytes,
    )
    if granted.nbytes == 0:
        installation.restore()
        return Installed(None, granted)
    return Installed(installation, granted)


class L2EvictStartup:
    """The plugin's start-up in this process: at most one report at a time.

    :meth:`run` never raises unless the deployment asked for ``on_error =
    "raise"`` (and then only after restoring stock b12x); on any fault it
    restores stock b12x and reports 0 with the reason, whatever the host
    passed. A second :meth:`run` before :meth:`finish` changes nothing and
    returns the first report.
    """

    def __init__(self) -> None:
        self.report: ReclaimReport | None = None

    def run(self, runtime: object) -> ReclaimReport:
        if self.report is not None:
            log.info("flare_l2evict: before_first_capture called again; keeping the first report")
            return self.report
        where = placement(runtime)
        settings: L2EvictSettings | None = None
        sizes: Sizes | None = None
        installed = Installed(None, Credit(0, "not started"))
        error: BaseException | None = None
        try:
            facts = read_runtime(runtime)
            settings = settings_from_config(facts.config)
            if not settings.enabled:
                installed = Installed(None, Credit(0, "disabled by config (enabled = false)"))
            else:
                sizes = measure_sizes(facts, settings)
                installed = install_and_credit(facts, settings, sizes)
        except Exception as caught:
            restore()
            error, installed = caught, Installed(None, Credit(0, _reason(caught)))
        agreed = self._agree(where, installed.credit, settings)
        report = self._report(where, installed, agreed, sizes)
        return self._hand_over(runtime, report, settings, error)

    def _agree(
        self, where: Placement, local: Credit, settings: L2EvictSettings | None
    ) -> Agreement:
        """Every rank reaches the agreement, faulted or not, so none waits forever."""
        digest, shown = settings_digest(settings)
        try:
            agreed = agree(
                RankOutcome(where.rank, local.nbytes, local.reason, digest, shown),
                where.process_group,  # type: ignore[arg-type]
            )
        except Exception as caught:
            agreed = Agreement(0, {}, f"tensor-parallel agreement failed ({_reason(caught)})")
        installation = active_installation()
        if agreed.reclaimed_bytes == 0:
            restore()  # keep every rank's races alike: if nothing is credited, nobody reads weights
        elif installation is not None:
            installation.credited_bytes = agreed.reclaimed_bytes  # what the audit holds it to
        return agreed

    def _report(
        self, where: Placement, installed: Installed, agreed: Agreement, sizes: Sizes | None
    ) -> ReclaimReport:
        installation = active_installation() if agreed.reclaimed_bytes else None
        figures: dict[str, Any] = {} if sizes is None else {
            "window_bytes": sizes.window_bytes,
            "stock_buffer_bytes": sizes.stock_buffer_bytes,
            "race_jobs": sizes.race_jobs,
        }  # fmt: skip
        source: dict[str, Any] = {}
        if installation is not None:
            source = {
                "source_tensor": installation.source_name,
                "source_storage_bytes": sum(read.storage_bytes for read in installation.sources),
                "sources": installation.sources,
                "read_kernel": installation.read_kernel,
            }
        return ReclaimReport(
            device=where.device,
            rank=where.rank,
            world_size=where.world_size,
            reclaimed_bytes=agreed.reclaimed_bytes,
            local_reclaimed_bytes=installed.credit.nbytes,
            mechanism=installation.mechanism if installation else "none",
            reason=agreed.reason or (None if agreed.reclaimed_bytes else installed.credit.reason),
            fallback_ranks=agreed.fallback_ranks,
            **figures,
            **source,
        )

    def _hand_over(
        self,
        runtime: object,
        report: ReclaimReport,
        settings: L2EvictSettings | None,
        error: BaseException | None,
    ) -> ReclaimReport:
        """Log, then credit the KV allocator; a failing allocator un-credits and restores."""
        raising = settings is not None and settings.on_error == "raise"
        if error is not None and raising:
            self.report = report
            log.warning("flare_l2evict: stock b12x eviction kept; %s", report.summary())
            raise L2EvictError(f"l2evict failed and on_error = 'raise': {report.reason}") from error
        add = getattr(getattr(runtime, "kv_allocator", None), "add_reclaimed", None)
        if callable(add):
            try:
                add(report)
            except Exception as caught:
                restore()
                reason = f"kv_allocator.add_reclaimed raised {_reason(caught)}"
                report = report.model_copy(
                    update={"reclaimed_bytes": 0, "mechanism": "none", "reason": reason}
                )
                error = caught
        self.report = report
        if report.reclaimed_bytes:
            log.info("flare_l2evict: %s", report.summary())
        else:
            log.warning("flare_l2evict: stock b12x eviction kept; %s", report.summary())
        if error is not None and raising:
            raise L2EvictError(f"l2evict failed and on_error = 'raise': {report.reason}") from error
        return report

    def finish(self) -> StartupAudit:
        """Start-up is over: audit, stock b12x back, no reference to the weights."""
        installation = active_installation()
        audit = StartupAudit(mechanism="none") if installation is None else installation.audit()
        restore()
        if self.report is not None or installation is not None:
            if audit.shortfall_bytes:
                log.warning("flare_l2evict: audit: %s", audit.summary())
            else:
                log.info("flare_l2evict: audit: %s", audit.summary())
        self.report = None
        return audit


def _reason(error: BaseException) -> str:
    """One line: our own errors as they are, anything else with its type."""
    if isinstance(error, L2EvictError):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:500]
