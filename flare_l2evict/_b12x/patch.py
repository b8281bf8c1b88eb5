"""The patch of b12x's race eviction and its undo, side by side (urllib3's pyopenssl style).

Each change's undo is registered before the change is made, and an undo puts
the original back only where the replacement still stands.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from .._errors import InstallError
from .._eviction import EvictionHandle, WeightEviction
from .._weights import same_device
from .proof import MARK, Flush, SeamFunction, SeamProof, StockBuffer, held_bytes
from .table import SeamRow

if TYPE_CHECKING:
    from .._basis import CreditBasis


class Locked(Protocol):
    """What orders the counts across threads: the process owner's lock."""

    lock: threading.RLock


@dataclass
class Counts:
    requested: int = 0
    served: int = 0
    stock_buffers: int = 0
    stock_bytes: int = 0


class Alive:
    """Evictions the seam handed out that b12x has not dropped yet, and the most at once."""

    def __init__(self, process: Locked) -> None:
        self.now = 0
        self.peak = 0
        self._process = process

    # Handles die on whatever thread drops them: the process lock (fork-safe) orders them.
    def handed(self) -> None:
        with self._process.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def dropped(self) -> None:
        with self._process.lock:
            self.now -= 1


def _device_key(device: object) -> str:
    try:
        found = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError, ValueError):
        return repr(device)
    if found.type == "cuda" and found.index is None and torch.cuda.is_available():
        found = torch.device("cuda", torch.cuda.current_device())
    return str(found)


def counted_stock(
    proof: SeamProof, counts: dict[str, Counts], stock: StockBuffer
) -> Callable[[object, bool], Flush | None]:
    """Stock's eviction for ``device``, counted as a stock buffer with the bytes it took.

    Off CUDA, an original that cannot make a buffer raises as stock would, unless
    ``fallback`` (the weights went away): then what a GPU would allocate is counted.
    """

    def make(device: object, fallback: bool) -> Flush | None:
        target = torch.device(device)  # type: ignore[call-overload]
        if target.type == "cuda":
            before = torch.cuda.memory_allocated(target)
            made = proof.row.call(proof.original, target, True)
            grown = torch.cuda.memory_allocated(target) - before
        else:
            try:
                made = proof.row.call(proof.original, target, True)
            except Exception:
                if not fallback:
                    raise
                made = None
            grown = stock.nbytes if made is None else held_bytes(made)
        entry = counts.setdefault(_device_key(device), Counts())
        entry.stock_buffers += 1
        entry.stock_bytes += max(0, grown)
        found: Flush | None = made
        return found

    return make


def inject(
    basis: CreditBasis,
    eviction: WeightEviction,
    counts: dict[str, Counts],
    alive: Alive,
    undo: list[Callable[[], None]],
) -> Callable[[], None]:
    """The step that patches b12x for ``eviction``; each undo lands in ``undo`` before its change.

    Fork-or-stock was asked once, by the basis (``basis.fork`` or ``basis.proof``).
    """
    fork, proof = basis.fork, basis.proof
    if fork is not None:
        views = eviction.views()
        handed = views[0] if len(views) == 1 else views

        def hand() -> None:
            undo.append(lambda: fork(None))  # first: an undo of nothing handed is harmless
            fork(handed)

        return hand
    if proof is None:
        raise InstallError("a basis with neither the fork's API nor a proven seam; stock b12x kept")
    make_stock = counted_stock(proof, counts, basis.stock)
    return lambda: _redirect(proof, eviction, counts, alive, make_stock, undo)


def stock_fallback(
    basis: CreditBasis, counts: dict[str, Counts], device: torch.device
) -> Callable[[], Flush | None] | None:
    """Stock's eviction for ``device`` after the weights went away (``None``: the fork's API)."""
    if basis.proof is None:
        return None
    make_stock = counted_stock(basis.proof, counts, basis.stock)
    return lambda: make_stock(device, True)


def _redirect(
    proof: SeamProof,
    eviction: WeightEviction,
    counts: dict[str, Counts],
    alive: Alive,
    make_stock: Callable[[object, bool], Flush | None],
    undo: list[Callable[[], None]],
) -> None:
    """Replace every seam the proof found, each undo step registered in ``undo`` before it."""
    target = eviction.device
    home = counts.setdefault(_device_key(target), Counts())
    replacements: dict[int, SeamFunction] = {}
    for module, original in proof.seams:
        replacement = _replacement(
            proof.row, original, eviction, target, home, counts, alive, make_stock
        )
        replacements[id(original)] = replacement
        _rebind(module, proof.row.function, original, replacement, undo)
    for binding in proof.bindings:
        replacement = replacements[id(binding.original)]
        _rebind(binding.owner, binding.name, binding.original, replacement, undo)


def _replacement(
    row: SeamRow,
    original: SeamFunction,
    eviction: WeightEviction,
    target: torch.device,
    home: Counts,
    counts: dict[str, Counts],
    alive: Alive,
    stock: Callable[[object, bool], Flush | None],
) -> SeamFunction:
    shape = inspect.signature(original)

    def seam_replacement(*args: object, **kwargs: object) -> Flush | None:
        # The row's calling convention names the device and the flag, wherever they sit.
        bound = shape.bind(*args, **kwargs)
        bound.apply_defaults()
        device, enabled = bound.arguments[row.device], bound.arguments[row.enabled]
        if not enabled:
            return original(*args, **kwargs)
        here = same_device(torch.device(device), target)
        if here and not eviction.released:
            home.requested += 1
            home.served += 1
            alive.handed()
            return EvictionHandle(eviction, alive.dropped)
        counts.setdefault(_device_key(device), Counts()).requested += 1
        return stock(device, False)

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
