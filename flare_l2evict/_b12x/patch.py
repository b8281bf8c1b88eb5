"""The patch of b12x's race eviction and its undo, side by side (urllib3's pyopenssl style).

Each change's undo is registered before the change is made, and an undo puts
the original back only where the replacement still stands.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .._errors import InstallError
from .._eviction import EvictionHandle, WeightEviction
from .._weights import same_device
from .proof import MARK, CreditBasis, Flush, SeamFunction, SeamProof, allocated, held_bytes


class Locked(Protocol):
    """What orders the counts across threads: the process owner's lock."""

    lock: threading.RLock


@dataclass
class Counts:
    """What the races asked of the seam on one device: :class:`DeviceAudit`'s fields."""

    requested: int = 0
    served_by_weights: int = 0
    stock_buffers: int = 0
    stock_bytes: int = 0


def _device_key(device: object) -> str:
    try:
        found = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError, ValueError):
        return repr(device)
    if found.type == "cuda" and found.index is None and torch.cuda.is_available():
        found = torch.device("cuda", torch.cuda.current_device())
    return str(found)


class Patch:
    """One installation's patch on its basis, and what the races asked of it.

    ``counts`` per device; ``alive``: evictions handed out that b12x has not dropped
    yet (``peak``: the most at once).
    """

    def __init__(self, basis: CreditBasis, process: Locked) -> None:
        self.basis = basis
        self.counts: dict[str, Counts] = {}
        self.alive = 0
        self.peak = 0
        self._process = process

    def of(self, device: object) -> Counts:
        return self.counts.setdefault(_device_key(device), Counts())

    # Handles die on whatever thread drops them: the process lock (fork-safe) orders them.
    def handed(self) -> None:
        with self._process.lock:
            self.alive += 1
            self.peak = max(self.peak, self.alive)

    def dropped(self) -> None:
        with self._process.lock:
            self.alive -= 1

    def stock(self, proof: SeamProof, device: object, fallback: bool) -> Flush | None:
        """Stock's eviction for ``device``, counted as a stock buffer with the bytes it took.

        Off CUDA, an original that cannot make a buffer raises as stock would, unless
        ``fallback`` (the weights went away): then what a GPU would allocate is counted.
        """
        target = torch.device(device)  # type: ignore[call-overload]
        try:
            made, grown = allocated(proof, target)
        except Exception:
            if not fallback or target.type == "cuda":
                raise
            made, grown = None, None
        if grown is None:  # off CUDA; sized outside the guard, so a closure's fault is not hidden
            grown = self.basis.stock.nbytes if made is None else held_bytes(made)
        entry = self.of(device)
        entry.stock_buffers += 1
        entry.stock_bytes += grown
        return made

    def fallback(self, device: torch.device) -> Callable[[], Flush | None] | None:
        """Stock's eviction for ``device`` once the weights went away (``None``: the fork's)."""
        proof = self.basis.proof
        return None if proof is None else lambda: self.stock(proof, device, True)

    def step(self, eviction: WeightEviction, undo: list[Callable[[], None]]) -> Callable[[], None]:
        """The step that patches b12x for ``eviction``; each undo lands in ``undo`` before it."""
        fork, proof = self.basis.fork, self.basis.proof
        if fork is not None:
            views = eviction.views()
            handed = views[0] if len(views) == 1 else views

            def hand() -> None:
                undo.append(lambda: fork(None))  # first: an undo of nothing handed is harmless
                fork(handed)

            return hand
        if proof is None:
            raise InstallError(
                "a basis with neither the fork's API nor a proven seam; stock b12x kept"
            )
        return lambda: self._redirect(proof, eviction, undo)

    def _redirect(
        self, proof: SeamProof, eviction: WeightEviction, undo: list[Callable[[], None]]
    ) -> None:
        """Replace every seam the proof found, and every other binding of it."""
        home = self.of(eviction.device)
        replacements: dict[int, SeamFunction] = {}
        for module, original in proof.seams:
            replacement = self._replacement(proof, original, eviction, home)
            replacements[id(original)] = replacement
            _rebind(module, proof.row.function, original, replacement, undo)
        for binding in proof.bindings:
            replacement = replacements[id(binding.original)]
            _rebind(binding.owner, binding.name, binding.original, replacement, undo)

    def _replacement(
        self, proof: SeamProof, original: SeamFunction, eviction: WeightEviction, home: Counts
    ) -> SeamFunction:
        row, target, shape = proof.row, eviction.device, inspect.signature(original)

        def seam_replacement(*args: object, **kwargs: object) -> Flush | None:
            # The row's calling convention names the device and the flag, wherever they sit.
            bound = shape.bind(*args, **kwargs)
            bound.apply_defaults()
            device, enabled = bound.arguments[row.device], bound.arguments[row.enabled]
            if not enabled:
                return original(*args, **kwargs)
            if same_device(torch.device(device), target) and not eviction.released:
                home.requested += 1
                home.served_by_weights += 1
                self.handed()
                return EvictionHandle(eviction, self.dropped)
            self.of(device).requested += 1
            return self.stock(proof, device, False)

        setattr(seam_replacement, MARK, True)
        seam_replacement.__wrapped__ = original  # type: ignore[attr-defined]
        return seam_replacement


def _rebind(
    owner: object, name: str, original: object, replacement: object, steps: list[Callable[[], None]]
) -> None:
    def undo() -> None:
        # Only put the original back if nobody replaced ours in the meantime (or it never was).
        if getattr(owner, name, None) is replacement:
            setattr(owner, name, original)

    steps.append(undo)
    setattr(owner, name, replacement)
