"""Choose weights in one call, raising on a shortfall, and install them: for the bench and tests.

A server's start-up never calls this; it runs :func:`~flare_l2evict._weights.storages_of`,
:func:`~flare_l2evict._decision.choose_regions` and
:func:`~flare_l2evict._weights.weight_choice` itself and reports a shortfall rather
than raising. This composes the same three, so what it chooses is what start-up chooses.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Mapping, Sequence

import torch

from .._b12x.proof import CreditBasis
from .._b12x.seam import seam_for
from .._decision import choose_regions
from .._errors import InstallError, L2EvictError, WeightsError
from .._eviction import Kernel, WeightEviction
from .._report import HOST, StartupAudit, Wording
from .._startup import Busy, Startup, end_dropped
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


class Installed:
    """An eviction installed by neither a host's hook nor a program's block (benches, tests).

    Its lifetime is the ``with`` block that holds it: ``with install(choice, basis) as
    installed:`` -- b12x's races read the weights inside the block, and on exit, whatever
    is raised, :meth:`end` audits it, puts stock b12x back and frees the process's one
    start-up slot. It is a start-up of its own (:class:`~flare_l2evict._startup.Startup`,
    owned by this object): the lifetime has that one implementation, none here.

    A handle dropped without :meth:`end` is a caller's bug, not a protocol: its start-up
    still ends (it holds the slot), with one WARNING naming it. A handle is entered once: a
    second entry (nested, or after its exit) raises one line, as an ``evicting_from`` block's
    does, so no second exit ends the first entry's install.
    """

    def __init__(
        self, choice: WeightChoice, basis: CreditBasis, kernel: Kernel, wording: Wording
    ) -> None:
        self._entered = threading.Lock()  # taken by the first entry, never given back
        # A host's hook refused meanwhile names what holds the slot: this, not a model.
        wording = dataclasses.replace(wording, kind="a tools install")
        token = object()  # how leave() finds this start-up, whatever cut the code below short
        try:
            began = Startup.begin(self, token, wording)
            if isinstance(began, Busy):
                raise InstallError(
                    f"{began.active} is already active in this process; fix: end it "
                    "(startup_complete, or leave the `with install(...)` block) before "
                    "installing again"
                )
            self.startup = began
            # Holds the start-up, never this object, so dropping the handle is what runs it.
            self._dropped = weakref.finalize(self, _ended_when_dropped, began)
            self._dropped.atexit = False  # the process ends anyway: no line at interpreter exit
            seam = seam_for(basis)
            self.mechanism = seam.mechanism
            self.eviction = WeightEviction(
                choice, fallback=seam.fallback(choice.device), kernel=kernel, until=wording.ends
            )
            began.install(seam, self.eviction)
        except BaseException:
            # The start-up this call began, if any, ends here: the caller gets no handle.
            Startup.leave(token, None, escaped=True)
            raise

    def __enter__(self) -> Installed:
        if not self._entered.acquire(blocking=False):
            raise L2EvictError(
                "this install(...) handle was already entered; a handle is entered once, and "
                "this entry changed nothing; fix: make a new install(...) for each with "
                "statement"
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.end()

    def audit(self) -> StartupAudit:
        return self.startup.audit()

    def restore(self) -> None:
        self.startup.restore()

    def end(self) -> StartupAudit:
        """The audit; stock b12x back and the slot free. Ending it again changes nothing."""
        audit = Startup.end(self.startup, own_only=True)
        self._dropped.detach()  # after the end: cut short before it, the drop still ends it
        return audit

    def __repr__(self) -> str:
        return repr(self.startup)


def _ended_when_dropped(startup: Startup) -> None:
    """A handle's finalizer: its start-up ends, named
    (:func:`~flare_l2evict._startup.end_dropped`); one already over is gone silently."""
    end_dropped(
        startup,
        "flare_l2evict: %s was dropped without end(), so stock b12x is back and races no longer "
        "read the weights; fix: hold it in `with install(...) as installed:` around the races",
        "an install(...) handle dropped without end()",
    )


def install(
    choice: WeightChoice, basis: CreditBasis, *, kernel: Kernel = "auto", words: Wording = HOST
) -> Installed:
    """Install ``choice`` in this process on a measured ``basis``, for a ``with`` block.

    ``with install(choice, basis) as installed:`` -- the races inside read the weights;
    the block's exit ends it (:meth:`Installed.end`).
    """
    return Installed(choice, basis, kernel, words)
