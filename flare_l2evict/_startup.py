"""One start-up, end to end: choose the source, build the eviction, install it, report."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ._agree import RankOutcome, agree, settings_digest
from ._errors import L2EvictError, SourceError
from ._eviction import WeightEviction
from ._install import Installation, install
from ._report import ReclaimReport, SourceRead
from ._settings import L2EvictSettings, settings_from_config
from ._source import choose_source
from ._window import device_l2_bytes, reclaimable_bytes, stock_buffer_bytes

log = logging.getLogger("flare_l2evict")


class L2EvictStartup:
    """The plugin's state for one process: at most one start-up at a time.

    :meth:`run` never raises unless the deployment asked for ``on_error =
    "raise"``; on any fault it restores stock b12x and reports 0 with the
    reason. A second :meth:`run` before :meth:`finish` changes nothing and
    returns the first report.
    """

    def __init__(self) -> None:
        self.report: ReclaimReport | None = None
        self.installation: Installation | None = None

    def run(self, runtime: Any) -> ReclaimReport:
        if self.report is not None:
            log.info("flare_l2evict: before_first_capture called again; keeping the first report")
            return self.report
        device = torch.device(getattr(runtime, "device", "cpu"))
        rank = int(getattr(runtime, "rank", 0) or 0)
        world_size = int(getattr(runtime, "world_size", 1) or 1)
        settings: L2EvictSettings | None = None
        fields: dict[str, Any] = {}
        local = 0
        reason: str | None = None
        error: BaseException | None = None
        try:
            settings = settings_from_config(getattr(runtime, "config", None))
            if not settings.enabled:
                reason = "disabled by config (plugins.l2evict.enabled = false)"
            else:
                local = self._install(runtime, device, settings, fields)
        except Exception as caught:
            self._restore()
            error = caught
            reason = (
                str(caught)
                if isinstance(caught, L2EvictError)
                else f"{type(caught).__name__}: {caught}"
            )
        # Every rank reaches the agreement, faulted or not, so none waits forever.
        digest, shown = settings_digest(settings)
        try:
            agreed = agree(
                RankOutcome(rank, local, reason, digest, shown),
                getattr(runtime, "process_group", None),
            )
        except Exception as caught:
            self._restore()
            agreed = None
            reason = f"tensor-parallel agreement failed ({type(caught).__name__}: {caught})"
            error = error or caught
        if agreed is not None and agreed.reclaimed_bytes == 0 and self.installation is not None:
            # Keep every rank's races alike: if nothing is credited, nobody reads weights.
            self._restore()
        report = ReclaimReport(
            device=str(device),
            rank=rank,
            world_size=world_size,
            reclaimed_bytes=0 if agreed is None else agreed.reclaimed_bytes,
            local_reclaimed_bytes=local,
            mechanism=self.installation.mechanism if self.installation else "none",
            reason=reason if agreed is None else agreed.reason or reason,
            fallback_ranks={} if agreed is None else agreed.fallback_ranks,
            **(fields if self.installation else _only_sizes(fields)),
        )
        self.report = report
        if self.installation is not None:
            log.info("flare_l2evict: %s", report.summary())
        else:
            log.warning("flare_l2evict: stock b12x eviction kept; %s", report.summary())
        if error is not None and settings is not None and settings.on_error == "raise":
            raise L2EvictError(f"l2evict failed and on_error = 'raise': {reason}") from error
        allocator = getattr(runtime, "kv_allocator", None)
        if allocator is not None:
            allocator.add_reclaimed(report)
        return report

    def _install(
        self, runtime: Any, device: torch.device, settings: L2EvictSettings, fields: dict[str, Any]
    ) -> int:
        """Install and return this rank's reclaimed bytes; ``fields`` gathers the report's."""
        l2 = getattr(runtime, "l2_cache_bytes", None)
        l2 = device_l2_bytes(device) if l2 is None else int(l2)
        race_jobs = int(getattr(runtime, "race_jobs", 0))
        stock = stock_buffer_bytes(l2)
        window = settings.window_bytes(l2)
        fields.update(window_bytes=window, stock_buffer_bytes=stock, race_jobs=race_jobs)
        choice = choose_source(runtime.resident_tensors(), device, window, settings.exclude)
        eviction = WeightEviction(choice)
        self.installation = install(eviction)
        fields.update(
            source_tensor=choice.name,
            source_storage_bytes=choice.total_bytes,
            sources=tuple(
                SourceRead(tensor=s.name, storage_bytes=s.nbytes) for s in choice.storages
            ),
        )
        reclaimed = reclaimable_bytes(race_jobs, l2)
        if reclaimed == 0:
            raise SourceError(
                f"nothing to reclaim: the host runs {race_jobs} race jobs; fix: pass "
                "runtime.race_jobs, the b12x race jobs this process holds at once"
            )
        return reclaimed

    def _restore(self) -> None:
        if self.installation is not None:
            installation, self.installation = self.installation, None
            installation.restore()

    def finish(self) -> None:
        """Start-up is over: stock b12x back, no reference to the weights, ready for the next."""
        self._restore()
        self.report = None


def _only_sizes(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v for k, v in fields.items() if k in ("window_bytes", "stock_buffer_bytes", "race_jobs")
    }
