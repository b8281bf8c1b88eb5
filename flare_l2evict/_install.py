"""Install a :class:`WeightEviction` into b12x's start-up races, and take it out again."""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ._errors import InstallError
from ._eviction import WeightEviction
from ._source import _same_device

log = logging.getLogger("flare_l2evict.install")

Mechanism = Literal["fork", "stock-seam"]

FORK_MODULE = "b12x.comm.pcie"
FORK_FUNCTION = "use_startup_eviction"
SEAM_MODULE = "b12x.preparation._measurement"
SEAM_FUNCTION = "_l2_flush_fn"
_MARK = "__flare_l2evict__"
_FIX = "fix: pip install 'flashinfer-python>=0.7.2' (or b12x>=1.5)"


@dataclass
class Installation:
    """An eviction in b12x's races. :meth:`restore` puts stock behaviour back."""

    mechanism: Mechanism
    eviction: WeightEviction
    _undo: Callable[[], None] = field(repr=False)
    _restored: bool = field(default=False, repr=False)

    def restore(self) -> None:
        """Stock b12x again, and no reference to the weights. Idempotent."""
        if not self._restored:
            self._restored = True
            try:
                self._undo()
            finally:
                self.eviction.release()
                if _ACTIVE.get("installation") is self:
                    _ACTIVE.clear()


_ACTIVE: dict[str, Installation] = {}


def active_installation() -> Installation | None:
    """The installation in force in this process, if any."""
    return _ACTIVE.get("installation")


def _fork_function() -> Callable[..., Any] | None:
    try:
        module = importlib.import_module(FORK_MODULE)
    except Exception:  # stock b12x may not even ship comm.pcie on every build
        return None
    function = getattr(module, FORK_FUNCTION, None)
    return function if callable(function) else None


def _seam() -> tuple[Any, Callable[..., Any]]:
    try:
        module = importlib.import_module(SEAM_MODULE)
    except ImportError as error:
        raise InstallError(f"b12x is not importable ({error}); {_FIX}") from None
    original = getattr(module, SEAM_FUNCTION, None)
    if original is None or not callable(original):
        raise InstallError(
            f"{SEAM_MODULE}.{SEAM_FUNCTION} is missing: this b12x is not one whose race "
            f"eviction the plugin knows; {_FIX}"
        )
    original = getattr(original, "__wrapped__", original) if hasattr(original, _MARK) else original
    try:
        parameters = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    shape = [(p.name, p.kind) for p in parameters]
    expected = [
        ("device", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("enabled", inspect.Parameter.KEYWORD_ONLY),
    ]
    if shape != expected:
        raise InstallError(
            f"{SEAM_MODULE}.{SEAM_FUNCTION} has signature {shape!r}, not (device, *, enabled): "
            f"this b12x changed its race eviction; {_FIX}, or pin flare-l2evict to a release "
            "that knows this b12x"
        )
    return module, original


def _stock_factory(device: torch.device) -> Callable[[], Callable[[], None] | None]:
    def make() -> Callable[[], None] | None:
        if device.type != "cuda":
            return None
        _, original = _seam()
        return original(device, enabled=True)

    return make


def install(eviction: WeightEviction) -> Installation:
    """Make b12x's race jobs on ``eviction.device`` read the weights.

    Tried in order: the fork's ``b12x.comm.pcie.use_startup_eviction(tensor)``
    (restored with ``use_startup_eviction(None)``), then stock b12x's seam
    ``b12x.preparation._measurement._l2_flush_fn``, which ``PreparationJob``
    and ``prepare_race_steps`` look up at call time: the replacement returns
    ``eviction`` for enabled calls on ``eviction.device`` and defers to the
    original everywhere else. The seam's shape is checked before anything is
    changed; on a mismatch b12x is left untouched and :class:`InstallError`
    says why. While an installation is active, installing again returns it.
    """
    current = _ACTIVE.get("installation")
    if current is not None:
        return current
    fork = _fork_function()
    if fork is not None:
        views = eviction._views  # the tensors the fork reads instead of its buffer
        fork(views[0] if len(views) == 1 else tuple(views))

        def undo_fork() -> None:
            fork(None)

        installation = Installation("fork", eviction, undo_fork)
    else:
        module, original = _seam()
        target = eviction.device
        eviction._fallback_factory = _stock_factory(target)

        def _l2_flush_fn(device: object, *, enabled: bool) -> Callable[[], None] | None:
            if enabled and not eviction.released and _same_device(torch.device(device), target):  # type: ignore[arg-type]
                return eviction
            return original(device, enabled=enabled)

        setattr(_l2_flush_fn, _MARK, True)
        _l2_flush_fn.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(module, SEAM_FUNCTION, _l2_flush_fn)

        def undo_seam() -> None:
            if getattr(module, SEAM_FUNCTION, None) is _l2_flush_fn:
                setattr(module, SEAM_FUNCTION, original)

        installation = Installation("stock-seam", eviction, undo_seam)
    _ACTIVE["installation"] = installation
    return installation


def restore() -> None:
    """Put stock b12x back and release the weights, whatever is installed. Idempotent."""
    current = _ACTIVE.get("installation")
    if current is not None:
        current.restore()
