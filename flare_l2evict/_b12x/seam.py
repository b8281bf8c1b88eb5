"""The two ways b12x's races can be pointed at the weights, behind one interface.

:func:`seam_for` picks one from the measured basis, once: :class:`ForkSeam` hands
the fork's ``use_startup_eviction`` the views read; :class:`StockSeam` replaces
stock b12x's eviction function (urllib3's pyopenssl style: the patch and its undo
side by side). Each change's undo is appended to the caller's list *before* the
change is made, and an undo puts the original back only where the replacement
still stands, so running every undo in the list, at any time and more than once,
is always safe.

Passive: nothing here imports the start-up or calls back into it.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from .. import _counting
from .._errors import InstallError
from .._eviction import EvictionHandle, WeightEviction
from .._weights import same_device
from .proof import MARK, CreditBasis, Flush, SeamFunction, SeamProof, allocated, held_bytes

Mechanism = Literal["fork", "stock-seam"]
Undo = list[Callable[[], None]]


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


class Seam(ABC):
    """Where one installation's eviction enters b12x, and what the races asked of it.

    ``counted``: whether the plugin sees each race's call (``counts`` per device;
    ``peak``: the most evictions handed out and alive at once).
    """

    mechanism: Mechanism
    counted: bool

    def __init__(self, basis: CreditBasis) -> None:
        self.basis = basis
        self.counts: dict[str, Counts] = {}
        self.alive = 0
        self.peak = 0

    @abstractmethod
    def install(self, eviction: WeightEviction, undo: Undo) -> None:
        """Point b12x's races at ``eviction``; each undo lands in ``undo`` before its change."""

    @abstractmethod
    def fallback(self, device: torch.device) -> Callable[[], Flush | None] | None:
        """Stock's eviction for ``device`` once the weights went away (``None``: b12x's own)."""

    def stock_bytes(self, device: str) -> int:
        """Bytes of the stock buffers the races made on ``device`` while installed."""
        found = self.counts.get(device)
        return 0 if found is None else found.stock_bytes


class ForkSeam(Seam):
    """The fork's ``use_startup_eviction(storage)``: b12x calls it, the plugin cannot count."""

    mechanism: Mechanism = "fork"
    counted = False

    def install(self, eviction: WeightEviction, undo: Undo) -> None:
        fork = self.basis.fork
        if fork is None:
            raise InstallError("a fork seam without the fork's API; stock b12x kept")
        views = eviction.views()
        undo.append(lambda: fork(None))  # first: an undo of nothing handed is harmless
        fork(views[0] if len(views) == 1 else views)

    def fallback(self, device: torch.device) -> None:
        return None


class StockSeam(Seam):
    """Stock b12x's eviction function, replaced wherever the proof found it bound."""

    mechanism: Mechanism = "stock-seam"
    counted = True

    def __init__(self, basis: CreditBasis, proof: SeamProof) -> None:
        super().__init__(basis)
        self.proof = proof

    def of(self, device: object) -> Counts:
        return self.counts.setdefault(_device_key(device), Counts())

    def _handed(self) -> None:
        with _counting.lock:
            self.alive += 1
            self.peak = max(self.peak, self.alive)

    def _dropped(self) -> None:
        with _counting.lock:
            self.alive -= 1

    def _stock(self, device: object, fallback: bool) -> Flush | None:
        """Stock's eviction for ``device``, counted as a stock buffer with the bytes it took.

        Off CUDA, an original that cannot make a buffer raises as stock would, unless
        ``fallback`` (the weights went away): then what a GPU would allocate is counted.
        """
        target = torch.device(device)  # type: ignore[call-overload]
        try:
            made, grown = allocated(self.proof, target)
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

    def fallback(self, device: torch.device) -> Callable[[], Flush | None]:
        return lambda: self._stock(device, True)

    def install(self, eviction: WeightEviction, undo: Undo) -> None:
        """Replace every seam the proof found, and every other binding of it."""
        proof, home = self.proof, self.of(eviction.device)
        replacements: dict[int, SeamFunction] = {}
        for module, original in proof.seams:
            replacement = self._replacement(original, eviction, home)
            replacements[id(original)] = replacement
            _rebind(module, proof.row.function, original, replacement, undo)
        for binding in proof.bindings:
            replacement = replacements[id(binding.original)]
            _rebind(binding.owner, binding.name, binding.original, replacement, undo)

    def _replacement(
        self, original: SeamFunction, eviction: WeightEviction, home: Counts
    ) -> SeamFunction:
        row, target, shape = self.proof.row, eviction.device, inspect.signature(original)

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
                self._handed()
                return EvictionHandle(eviction, self._dropped)
            self.of(device).requested += 1
            return self._stock(device, False)

        setattr(seam_replacement, MARK, True)
        seam_replacement.__wrapped__ = original  # type: ignore[attr-defined]
        return seam_replacement


def seam_for(basis: CreditBasis) -> Seam:
    """The seam ``basis`` was measured on: the fork's API, or stock's proven function."""
    if basis.proof is not None:
        return StockSeam(basis, basis.proof)
    if basis.fork is not None:
        return ForkSeam(basis)
    raise InstallError("a basis with neither the fork's API nor a proven seam; stock b12x kept")


def _rebind(owner: object, name: str, original: object, replacement: object, undo: Undo) -> None:
    def put_back() -> None:
        # Only put the original back if nobody replaced ours in the meantime (or it never was);
        # one line, so a signal handler that ends this start-up and installs the next runs
        # before the check or after the write, never between them.
        getattr(owner, name, None) is replacement and setattr(owner, name, original)  # type: ignore[func-returns-value]

    undo.append(put_back)
    setattr(owner, name, replacement)
