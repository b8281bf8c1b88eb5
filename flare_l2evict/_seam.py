"""Prove, before anything changes, that b12x's races take their eviction where the plugin can.

Stock b12x makes each race's eviction buffer in one function,
``b12x.preparation._measurement._l2_flush_fn(device, *, enabled)``. Redirecting
that module global only helps if every race asks it at call time. This module
checks that, in the b12x that is loaded, and measures what the function really
allocates, so the KV credit rests on facts rather than on a copied formula.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._errors import InstallError
from ._provider import provider_problem, versions
from ._window import stock_buffer_bytes

SEAM_MODULE = "b12x.preparation._measurement"
SEAM_FUNCTION = "_l2_flush_fn"
FORK_MODULE = "b12x.comm.pcie"
FORK_FUNCTION = "use_startup_eviction"
MARK = "__flare_l2evict__"
"""Attribute set on the plugin's replacement of the seam (its ``__wrapped__`` is the original)."""

PACKAGE_ROOTS = ("b12x", "flashinfer.experimental.b12x")
"""Where a loaded b12x lives: standalone, or inside flashinfer-python (which aliases the first)."""

CALLERS = (
    ("preparation._measurement", "prepare_race_steps"),
    ("preparation.session", "PreparationJob._measure"),
)
"""The race code known to make evictions: (module under the root, qualified name)."""

FIX = "fix: pip install 'flashinfer-python>=0.7.2' (or b12x>=1.5)"

Flush = Callable[[], None]
SeamFunction = Callable[..., Flush | None]


@dataclass(frozen=True)
class Binding:
    """A name, outside the seam module, bound to the original seam function at import."""

    owner: types.ModuleType
    name: str
    original: SeamFunction


@dataclass(frozen=True)
class SeamProof:
    """What :func:`prove_seam` found; :func:`~flare_l2evict._install.install` acts on it alone.

    Invariant: every race code path of the loaded b12x that makes an eviction
    reaches one of ``seams``' ``_l2_flush_fn`` at call time, either through
    its module global or through one of ``bindings``. Replacing exactly those
    names therefore hands every race the plugin's eviction.
    """

    seams: tuple[tuple[types.ModuleType, SeamFunction], ...]
    bindings: tuple[Binding, ...]
    b12x_version: str | None
    flashinfer_version: str | None

    @property
    def original(self) -> SeamFunction:
        return self.seams[0][1]


@dataclass(frozen=True)
class StockBuffer:
    """What stock b12x allocates for one race job's eviction on a device.

    ``measured`` is true when the bytes were read off the CUDA allocator
    around one call of the original seam; otherwise they are the formula
    ``max(2 x L2, 64 MiB)`` rounded to float32 words (no CUDA device to ask).
    """

    nbytes: int
    measured: bool


def unwrap(function: Any) -> Any:
    """The original seam function behind the plugin's replacement, if it is one."""
    while getattr(function, MARK, False) and hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


def fork_function() -> Callable[..., Any] | None:
    """The fork's ``use_startup_eviction``, where the loaded b12x has it."""
    try:
        module = importlib.import_module(FORK_MODULE)
    except Exception:  # stock b12x may not even ship comm.pcie on every build
        return None
    function = getattr(module, FORK_FUNCTION, None)
    return function if callable(function) else None


def _loaded_b12x() -> list[types.ModuleType]:
    seen: dict[int, types.ModuleType] = {}
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType) and any(
            name == root or name.startswith(root + ".") for root in PACKAGE_ROOTS
        ):
            seen.setdefault(id(module), module)
    return list(seen.values())


def _check_signature(module: types.ModuleType, original: object) -> SeamFunction:
    if not callable(original):
        raise InstallError(
            f"{module.__name__}.{SEAM_FUNCTION} is missing: this b12x is not one whose race "
            f"eviction the plugin knows; {FIX}"
        )
    try:
        shape = [(p.name, p.kind) for p in inspect.signature(original).parameters.values()]
    except (TypeError, ValueError):
        shape = []
    expected = [
        ("device", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("enabled", inspect.Parameter.KEYWORD_ONLY),
    ]
    if shape != expected:
        raise InstallError(
            f"{module.__name__}.{SEAM_FUNCTION} has signature {shape!r}, not (device, *, enabled): "
            f"this b12x changed its race eviction; {FIX}, or pin flare-l2evict to a release "
            "that knows this b12x"
        )
    return original


def _root_of(module: types.ModuleType) -> str:
    return module.__name__[: -len(".preparation._measurement")]


def _resolve(root: str, module_tail: str, qualname: str) -> object | None:
    try:
        module = importlib.import_module(f"{root}.{module_tail}")
    except ImportError:
        return None
    target: object = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _check_callers(root: str) -> None:
    for module_tail, qualname in CALLERS:
        caller = _resolve(root, module_tail, qualname)
        if caller is None and module_tail == "preparation.session":
            continue  # a b12x without preparation sessions makes no job evictions
        code = getattr(caller, "__code__", None)
        if code is None:
            raise InstallError(
                f"{root}.{module_tail}.{qualname} is missing: this b12x races in code the "
                f"plugin does not know; {FIX}"
            )
        if SEAM_FUNCTION not in code.co_names:
            raise InstallError(
                f"{root}.{module_tail}.{qualname} no longer asks {SEAM_FUNCTION} for its "
                "eviction, so its buffers cannot be taken over; stock b12x kept. "
                f"{FIX}, or pin flare-l2evict to a release that knows this b12x"
            )


def _bindings(
    modules: list[types.ModuleType], originals: dict[int, SeamFunction], seams: set[int]
) -> list[Binding]:
    found: list[Binding] = []
    for module in modules:
        for name, value in list(vars(module).items()):
            value = unwrap(value)
            if id(value) in originals and not (id(module) in seams and name == SEAM_FUNCTION):
                found.append(Binding(module, name, originals[id(value)]))
            elif isinstance(value, type) and value.__module__ == module.__name__:
                _refuse_hidden(value, originals, f"{module.__name__}.{name}")
            elif isinstance(value, types.FunctionType):
                _refuse_hidden(value, originals, f"{module.__name__}.{name}")
    return found


def _refuse_hidden(owner: object, originals: dict[int, SeamFunction], where: str) -> None:
    """Refuse copies of the seam the plugin cannot redirect: class attributes, defaults."""
    held: list[object] = []
    if isinstance(owner, type):
        for attribute in vars(owner).values():
            held.append(getattr(attribute, "__func__", attribute))
    else:
        held.extend(getattr(owner, "__defaults__", None) or ())
        held.extend((getattr(owner, "__kwdefaults__", None) or {}).values())
    if any(id(unwrap(item)) in originals for item in held):
        raise InstallError(
            f"{where} holds its own copy of {SEAM_FUNCTION}, which the plugin cannot redirect; "
            f"stock b12x kept. {FIX}, or pin flare-l2evict to a release that knows this b12x"
        )


def prove_seam() -> SeamProof:
    """Check the loaded b12x and return what an installation must replace.

    Imports the seam module and its callers' modules, then checks, changing
    nothing: the seam's signature in every loaded copy of b12x; that each
    known caller (:data:`CALLERS`) names the seam in its code, i.e. looks it
    up when it runs; that no class attribute or default argument holds the
    original; and that a disabled call returns ``None`` without raising.
    Module-level bindings of the original elsewhere in b12x are returned as
    :class:`Binding` for the installation to redirect too. Raises
    :class:`InstallError` with the reason and the fix.
    """
    if (problem := provider_problem()) is not None:  # no usable torch or b12x: say which
        raise InstallError(problem)
    try:
        importlib.import_module(SEAM_MODULE)
    except ImportError as error:
        b12x, flashinfer = versions()
        if b12x or flashinfer:
            which = f"b12x {b12x}" if b12x else f"flashinfer-python {flashinfer}"
            raise InstallError(
                f"{which} has no {SEAM_MODULE} ({error}): it runs no start-up races the plugin "
                f"knows; {FIX}"
            ) from None
        raise InstallError(f"b12x is not importable ({error}); {FIX}") from None
    except Exception as error:  # a broken install fails in its own ways
        raise InstallError(
            f"importing {SEAM_MODULE} failed ({type(error).__name__}: {error}); {FIX}"
        ) from None
    modules = _loaded_b12x()
    seams: list[tuple[types.ModuleType, SeamFunction]] = []
    for module in modules:
        if module.__name__.endswith(".preparation._measurement"):
            original = _check_signature(module, unwrap(getattr(module, SEAM_FUNCTION, None)))
            if all(module is not m for m, _ in seams):
                seams.append((module, original))
    for module, _ in seams:
        _check_callers(_root_of(module))
    modules = _loaded_b12x()  # the callers' modules are loaded now
    originals = {id(original): original for _, original in seams}
    bindings = _bindings(modules, originals, {id(m) for m, _ in seams})
    for _, original in seams:
        try:
            probe = original(torch.device("cpu"), enabled=False)
        except Exception as error:
            raise InstallError(
                f"{SEAM_MODULE}.{SEAM_FUNCTION}(enabled=False) raised "
                f"{type(error).__name__}: {error}; stock b12x kept. {FIX}"
            ) from None
        if probe is not None:
            raise InstallError(
                f"{SEAM_MODULE}.{SEAM_FUNCTION}(enabled=False) returned {type(probe).__name__}, "
                f"not None: this b12x changed its race eviction; {FIX}"
            )
    b12x, flashinfer = versions()
    return SeamProof(tuple(seams), tuple(bindings), b12x, flashinfer)


def measure_stock_buffer(
    original: SeamFunction, device: torch.device, l2_cache_bytes: int
) -> StockBuffer:
    """What one call of stock's seam allocates on ``device``; freed again before returning.

    On CUDA the original is called once, before the KV cache is sized, and
    the allocator's growth is read; the buffer is then returned to the driver.
    Off CUDA, where an original makes a buffer at all, the tensors its
    eviction holds are counted; where it cannot (stock b12x reads the L2 size
    from a CUDA device), the formula ``max(2 x L2, 64 MiB)`` stands in.
    """
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        before = torch.cuda.memory_allocated(device)
        made = original(device, enabled=True)
        grown = torch.cuda.memory_allocated(device) - before
        del made
        torch.cuda.empty_cache()
        return StockBuffer(max(0, grown), measured=True)
    try:
        made = original(device, enabled=True)
    except Exception:
        return StockBuffer(stock_buffer_bytes(l2_cache_bytes), measured=False)
    held = held_bytes(made)
    del made
    return StockBuffer(held, measured=True)


def held_bytes(flush: object) -> int:
    """Bytes of the distinct tensor storages a flush closure holds."""
    storages: dict[int, int] = {}
    for cell in getattr(flush, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())
