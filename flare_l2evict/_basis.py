"""The byte figures one device's credit rests on: L2, the window, stock's real per-job buffer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._b12x.proof import SeamProof, StockBuffer, fork_api, measure_stock_buffer, prove_seam
from ._b12x.table import fork_rows
from ._window import device_l2_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from ._settings import L2EvictSettings


@dataclass(frozen=True)
class CreditBasis:
    """The byte figures of this device that the credit rests on, and the seam they came from.

    Fork-or-stock is asked once, here: exactly one of ``fork`` and ``proof`` is
    set. ``stock`` is measured once and used by both credit and installation.
    """

    l2_cache_bytes: int
    window_bytes: int
    stock: StockBuffer
    race_jobs: int
    proof: SeamProof | None
    fork: Callable[..., Any] | None = None


def measure_basis(
    device: torch.device,
    l2_cache_bytes: int | None,
    settings: L2EvictSettings,
    race_jobs: int,
) -> CreditBasis:
    """L2, window and stock's real per-job buffer on ``device``.

    Raises :class:`~flare_l2evict.InstallError` when b12x fails the proof and the
    fork's API is absent.
    """
    l2 = device_l2_bytes(device) if l2_cache_bytes is None else l2_cache_bytes
    window = settings.window_bytes(l2)
    fork = fork_api()
    if fork is not None:
        formula = fork_rows()[0].buffer_bytes(l2)
        return CreditBasis(l2, window, StockBuffer(formula, False), race_jobs, None, fork)
    proof = prove_seam()
    stock = measure_stock_buffer(proof, device, l2)
    return CreditBasis(l2, window, stock, race_jobs, proof)
