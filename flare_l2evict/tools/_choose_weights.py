"""Choose weights in one call, raising on a shortfall, and install them: for the bench and tests.

A server's start-up never calls this; it runs :func:`~flare_l2evict._weights.storages_of`,
:func:`~flare_l2evict._decision.choose_regions` and
:func:`~flare_l2evict._weights.weight_choice` itself and reports a shortfall rather
than raising. This composes the same three, so what it chooses is what start-up chooses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .._b12x.proof import CreditBasis
from .._decision import choose_regions
from .._errors import WeightsError
from .._eviction import Kernel
from .._install import Installation
from .._lifecycle import PROCESS
from .._report import HOST, Words
from .._weights import WeightChoice, storages_of, weight_choice


def choose_weights(
    tensors: Mapping[str, torch.Tensor],
    device: torch.device | str,
    window_bytes: int,
    exclude: Sequence[str] = (),
) -> WeightChoice:
    """The largest region of memory resident on ``device``; several, largest first, if one is short.

    Storages are counted by address range: tensors that view one allocation, and
    storage objects that overlap in memory, count once. Storages on other devices
    (host RAM, pinned or not), meta tensors, empty or freed storages, and any
    region touched by a tensor whose name matches an ``exclude`` glob are skipped.
    The same tensors give the same choice: ties go to the name that sorts first.
    Raises :class:`WeightsError` with the reason when the eligible bytes together
    are fewer than ``window_bytes``.
    """
    device = torch.device(device)
    found, storages = storages_of(tensors, device)
    choice = choose_regions(found, window_bytes, exclude, where=str(device))
    if choice.shortfall is not None:
        raise WeightsError(choice.shortfall)
    return weight_choice(choice, storages, device)


def install(
    choice: WeightChoice, basis: CreditBasis, *, kernel: Kernel = "auto", words: Words = HOST
) -> Installation:
    """Install ``choice`` in this process on a measured ``basis`` (see ``Process.install``)."""
    return PROCESS.install(choice, basis, words, kernel)
