"""Prove, before anything changes, that b12x's races take their eviction where the plugin can.

Redirecting the seam's module global only helps if every race asks it at call
time; this checks that for the loaded b12x's row, and measures what the seam
really allocates, so the KV credit rests on facts rather than a copied formula.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import logging
import math
import operator
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .._credit import stock_buffer_bytes
from .._errors import InstallError
from .._log import say
from .._text import described, described_value, literal, shown
from .provider import MIN_B12X, MIN_FLASHINFER, provider_problem, versions
from .table import ROOTS, SeamRow, rows

if TYPE_CHECKING:
    from .._settings import L2EvictSettings

log = logging.getLogger("flare_l2evict.seam")

MARK = "__flare_l2evict__"
"""Attribute set on the plugin's replacement of the seam (its ``__wrapped__`` is the original)."""

FIX = f"fix: pip install 'flashinfer-python>={MIN_FLASHINFER}' (or b12x>={MIN_B12X})"

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
    """What :func:`prove_seam` found: the names :class:`~.seam.StockSeam` replaces, and no others.

    Invariant: every race code path of the loaded b12x that makes an eviction reaches one of
    ``seams``' ``_l2_flush_fn`` at call time, through its module global or one of
    ``bindings``: replacing exactly those names hands every race the plugin's eviction.
    """

    seams: tuple[tuple[types.ModuleType, SeamFunction], ...]
    bindings: tuple[Binding, ...]
    b12x_version: str | None
    flashinfer_version: str | None
    row: SeamRow
    """The table's row this b12x matched: the names an installation replaces."""

    @property
    def original(self) -> SeamFunction:
        return self.seams[0][1]


@dataclass(frozen=True)
class StockBuffer:
    """What stock b12x allocates for one race job's eviction on a device.

    ``measured``: read off one call of the seam (:func:`allocated`); else the formula
    ``max(2 x L2, 64 MiB)`` in float32 words.
    """

    nbytes: int
    measured: bool


def unwrap(function: Any) -> Any:
    """The original seam function behind the plugin's replacement, if it is one."""
    while getattr(function, MARK, False) and hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


def fork_api() -> Callable[..., Any] | None:
    """The fork's API where the loaded b12x has it, its signature checked against its row; raises
    :class:`InstallError` on another shape: no storage goes to a call the plugin does not know."""
    for row in rows("fork"):
        function = row.loaded()
        if function is not None:
            return _check_signature(row, importlib.import_module(row.module_path), function)
    return None


_SUBMODULES = tuple(root + "." for root in ROOTS)


def _loaded_b12x() -> list[types.ModuleType]:
    # The thousands of names a server has loaded are tested in C (map, compress): every
    # start-up scans, and a Python loop over them was most of a start-up's own time. The
    # entries are copied in one call, so no key is hashed (a str subclass's __hash__ would
    # run) and none looked up again; a key is tested by its type, never by isinstance (which
    # asks a key that is no str for its __class__), and a str subclass's text is read by
    # str's own methods: no method of a host's key runs.
    entries = list(sys.modules.items())
    keys = map(operator.itemgetter(0), entries)
    textual = map(issubclass, map(type, keys), itertools.repeat(str))
    entries = list(itertools.compress(entries, textual))
    names = map(operator.itemgetter(0), entries)
    rooted = map(str.startswith, names, itertools.repeat(ROOTS))
    seen: dict[int, tuple[str, types.ModuleType]] = {}
    for name, module in itertools.compress(entries, rooted):
        text = str.__str__(name)
        if (text in ROOTS or text.startswith(_SUBMODULES)) and issubclass(
            type(module), types.ModuleType
        ):
            seen.setdefault(id(module), (text, module))
    return [_read(text, module) for text, module in seen.values()]


def _read(name: str, module: types.ModuleType) -> types.ModuleType:
    """``module`` once its name and namespace could be read (a lazy module loads here); raises
    naming it and the scan when they cannot: the scan cannot tell what a module it cannot
    read holds, so stock b12x stays."""
    try:
        module.__name__, vars(module)  # read for what reading them raises
    except Exception as error:
        raise InstallError(
            f"sys.modules[{literal(name)}] raised {described(error, 300)} when read by the "
            "plugin's scan of b12x's loaded modules for copies of its eviction function; stock "
            f"b12x kept. fix: make `import {shown(name, 120)}` succeed before start-up, or "
            "remove it from sys.modules"
        ) from None
    return module


def _check_signature(row: SeamRow, module: types.ModuleType, original: object) -> SeamFunction:
    if not callable(original):
        raise InstallError(
            f"{module.__name__}.{row.function} is missing: this b12x is not one whose race "
            f"eviction the plugin knows; {FIX}"
        )
    try:
        shape = [(p.name, p.kind.name) for p in inspect.signature(original).parameters.values()]
    except (TypeError, ValueError):
        shape = []
    if tuple(shape) != row.signature:
        shown = [inspect.Parameter(n, getattr(inspect.Parameter, k)) for n, k in row.signature]
        raise InstallError(
            f"{module.__name__}.{row.function} has signature {shape!r}, "
            f"not {inspect.Signature(shown)} as "
            f"{row.name} has it: this b12x changed its race eviction; {FIX}, or pin "
            "flare-l2evict to a release that knows this b12x"
        )
    return original


def _resolve(root: str, module_tail: str, qualname: str) -> object | None:
    try:
        target: object = importlib.import_module(f"{root}.{module_tail}")
    except ImportError:
        return None
    for part in qualname.split("."):
        target = getattr(target, part, None)  # None from the first missing part on
    return target


def _check_callers(row: SeamRow, root: str) -> None:
    for module_tail, qualname in row.callers:
        caller = _resolve(root, module_tail, qualname)
        if caller is None and module_tail in row.optional:
            continue
        code = getattr(caller, "__code__", None)
        if code is None:
            raise InstallError(
                f"{root}.{module_tail}.{qualname} is missing: this b12x races in code the "
                f"plugin does not know; {FIX}"
            )
        if row.function not in code.co_names:
            raise InstallError(
                f"{root}.{module_tail}.{qualname} no longer asks {row.function} for its "
                "eviction, so its buffers cannot be taken over; stock b12x kept. "
                f"{FIX}, or pin flare-l2evict to a release that knows this b12x"
            )


def _bindings(
    row: SeamRow,
    modules: list[types.ModuleType],
    originals: dict[int, SeamFunction],
    seams: set[int],
) -> list[Binding]:
    found: list[Binding] = []
    for module in modules:
        for name, value in list(vars(module).items()):
            value = unwrap(value)
            if id(value) in originals and not (id(module) in seams and name == row.function):
                found.append(Binding(module, name, originals[id(value)]))
            elif isinstance(value, types.FunctionType) or (
                isinstance(value, type) and value.__module__ == module.__name__
            ):
                _refuse_hidden(row, value, originals, f"{module.__name__}.{name}")
    return found


def _refuse_hidden(
    row: SeamRow, owner: object, originals: dict[int, SeamFunction], where: str
) -> None:
    """Refuse copies of the seam the plugin cannot redirect: class attributes, defaults."""
    if isinstance(owner, type):
        held = [getattr(attribute, "__func__", attribute) for attribute in vars(owner).values()]
    else:
        held = list(getattr(owner, "__defaults__", None) or ())
        held += (getattr(owner, "__kwdefaults__", None) or {}).values()
    if any(id(unwrap(item)) in originals for item in held):
        raise InstallError(
            f"{where} holds its own copy of {row.function}, which the plugin cannot redirect; "
            f"stock b12x kept. {FIX}, or pin flare-l2evict to a release that knows this b12x"
        )


def _import_row() -> SeamRow:
    """The first stock row whose module imports; raises naming the first row when none does."""
    stock = rows("stock")
    for row in stock:
        try:
            importlib.import_module(row.module_path)
        except ImportError:
            continue
        except Exception as error:  # a broken install fails in its own ways
            raise _blamed(f"importing {row.module_path}", error) from None
        return row
    try:
        importlib.import_module(stock[0].module_path)
    except ImportError as error:
        b12x, flashinfer = versions()
        if b12x or flashinfer:
            which = f"b12x {b12x}" if b12x else f"flashinfer-python {flashinfer}"
            raise InstallError(
                f"{which} has no {stock[0].module_path} ({error}): it runs no start-up races the "
                f"plugin knows; {FIX}"
            ) from None
        raise InstallError(f"b12x is not importable ({error}); {FIX}") from None
    return stock[0]  # imported on the second try: a module that fails once, then loads


def host_mode() -> str | None:
    """The host's innermost active ``TorchFunctionMode``, by name (``None``: none is active)."""
    try:
        stack = torch.overrides._get_current_function_mode_stack()  # type: ignore[no-untyped-call]
    except Exception:
        return None
    return type(stack[-1]).__qualname__ if stack else None


def _blamed(what: str, error: Exception) -> InstallError:
    """``what`` raised ``error``: the host's own torch mode when one is active, else b12x."""
    mode = host_mode()
    if mode is not None:
        return InstallError(
            f"{what} raised {type(error).__name__}: {error} under the host's own "
            f"TorchFunctionMode {mode}; stock b12x kept. fix: let the host's mode pass "
            "torch's calls, or enter it after before_first_capture"
        )
    return InstallError(f"{what} raised {type(error).__name__}: {error}; stock b12x kept. {FIX}")


def _probe_disabled(row: SeamRow, original: SeamFunction) -> None:
    try:
        probe = row.call(original, torch.device("cpu"), False)
    except Exception as error:
        raise _blamed(f"{row.dotted}(enabled=False)", error) from None
    if probe is not None:
        raise InstallError(
            f"{row.dotted}(enabled=False) returned {type(probe).__name__}, not None: this b12x "
            f"changed its race eviction; {FIX}"
        )


def prove_seam() -> SeamProof:
    """Check the loaded b12x against its stock row and return what an installation must replace.

    Changes nothing. Checks the seam's signature in every loaded copy of b12x, that each caller
    looks it up when it runs, that no class attribute or default argument holds the original, and
    that a disabled call returns ``None``; other module-level bindings of the original are returned
    as :class:`Binding`. Raises :class:`InstallError` with the reason and the fix.
    """
    if (problem := provider_problem()) is not None:  # no usable torch or b12x: say which
        raise InstallError(problem)
    row = _import_row()
    seams: list[tuple[types.ModuleType, SeamFunction]] = []
    roots: list[str] = []
    for module in _loaded_b12x():  # each module once
        if (root := row.root_of(module.__name__)) is not None:
            original = _check_signature(row, module, unwrap(getattr(module, row.function, None)))
            seams.append((module, original))
            roots.append(root)
    for root in roots:
        _check_callers(row, root)
    modules = _loaded_b12x()  # the callers' modules are loaded now
    originals = {id(original): original for _, original in seams}
    bindings = _bindings(row, modules, originals, {id(m) for m, _ in seams})
    for _, original in seams:
        _probe_disabled(row, original)
    b12x, flashinfer = versions()
    return SeamProof(tuple(seams), tuple(bindings), b12x, flashinfer, row)


def allocated(proof: SeamProof, device: torch.device) -> tuple[Flush | None, int | None]:
    """One call of stock's seam on ``device`` and, on CUDA, the caching allocator's growth
    (``None`` elsewhere: the caller sizes the closure, outside its guard of the call)."""
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
        made = proof.row.call(proof.original, device, True)
        return made, max(0, torch.cuda.memory_allocated(device) - before)
    return proof.row.call(proof.original, device, True), None


def measure_stock_buffer(
    proof: SeamProof, device: torch.device, l2_cache_bytes: int
) -> StockBuffer:
    """What one call of stock's seam allocates on ``device``; freed again before returning."""
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    try:
        made, grown = allocated(proof, device)
    except Exception:
        if cuda:
            raise
        return StockBuffer(stock_buffer_bytes(l2_cache_bytes), measured=False)
    nbytes = held_bytes(made) if grown is None else grown  # a closure that cannot be sized raises
    del made
    if cuda:
        torch.cuda.empty_cache()
    return StockBuffer(nbytes, measured=True)


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
    free_bytes: int | None = None
    """What was free to torch on the device when the basis was measured
    (:func:`device_free_bytes`): the credit never exceeds it. ``None`` off CUDA."""


def device_l2_bytes(device: torch.device) -> int:
    """The L2 size of a CUDA device, as stock b12x reads it."""
    if device.type != "cuda":
        raise ValueError(
            f"{device} has no L2 size to read; the host must pass runtime.l2_cache_bytes"
        )
    return int(torch.cuda.get_device_properties(device).L2_cache_size)


def device_free_bytes(device: torch.device) -> int | None:
    """What is free to torch on a CUDA device now: the driver's free memory plus what torch's
    caching allocator holds unused (a host's reservation for the races is part of it).
    ``None`` off CUDA: no such figure."""
    if device.type != "cuda":
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    free = _driver_free_bytes(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(0, free + unused)


def _driver_free_bytes(device: torch.device) -> int:
    """The free bytes of ``torch.cuda.mem_get_info``'s (free, total); raises one line naming
    the call and what it returned when that is not two figures of bytes (NaN, inf, a third
    value: a host's patch of torch, or a broken driver), since no credit can be bounded by it."""
    got = torch.cuda.mem_get_info(device)
    figures = got if type(got) in (tuple, list) and len(got) == 2 else ()
    if all(_bytes_figure(figure) for figure in figures) and figures:
        return int(figures[0])
    raise InstallError(
        f"torch.cuda.mem_get_info({device}) returned {described_value(got, 200)}, not the "
        "device's (free, total) bytes, so the memory free to back a credit is unknown; stock "
        "b12x kept. fix: let torch.cuda.mem_get_info return the driver's two figures (undo "
        "the patch of it, or repair the CUDA driver)"
    )


def _bytes_figure(value: object) -> bool:
    """A count of bytes: a whole number >= 0 (a float of one too), never NaN, inf or a bool."""
    if type(value) is int:
        return value >= 0
    return type(value) is float and math.isfinite(value) and value >= 0 and value.is_integer()


def measure_basis(
    device: torch.device, l2_cache_bytes: int | None, settings: L2EvictSettings, race_jobs: int
) -> CreditBasis:
    """L2, window, stock's real per-job buffer and the memory free on ``device``, each read
    once; raises :class:`InstallError` when b12x fails the proof and has no fork API."""
    l2 = device_l2_bytes(device) if l2_cache_bytes is None else l2_cache_bytes
    window = settings.window_bytes(l2)
    fork = fork_api()
    if fork is not None:
        formula = StockBuffer(stock_buffer_bytes(l2), measured=False)
        basis = CreditBasis(l2, window, formula, race_jobs, None, fork, device_free_bytes(device))
    else:
        proof = prove_seam()
        stock = measure_stock_buffer(proof, device, l2)  # freed again: not in what is free
        basis = CreditBasis(l2, window, stock, race_jobs, proof, None, device_free_bytes(device))
    if log.isEnabledFor(logging.DEBUG):
        _log_basis(basis, device, settings.window, l2_cache_bytes is not None)
    return basis


def _log_basis(basis: CreditBasis, device: torch.device, window: object, given: bool) -> None:
    """One DEBUG line: which seam (the fork's or stock's, which b12x) and the credit's figures."""
    proof, fork = basis.proof, basis.fork
    if proof is None:
        seam = f"the fork's {getattr(fork, '__module__', '?')}.{getattr(fork, '__qualname__', '?')}"
    else:
        release = proof.b12x_version or f"of flashinfer-python {proof.flashinfer_version or '-'}"
        seam = (
            f"{proof.row.name}: {proof.row.function} proved in {len(proof.seams)} loaded "
            f"module(s) (its callers look it up when they run), {len(proof.bindings)} other "
            f"binding(s) to redirect; b12x {release}"
        )
    how = "measured" if basis.stock.measured else "formula max(2 x L2, 64 MiB)"
    free = "" if basis.free_bytes is None else f", {basis.free_bytes:,} bytes free to torch"
    say(log, logging.DEBUG, "flare_l2evict: seam on %s: %s; basis: stock buffer %s bytes per "
        "race job (%s), window %s bytes (%s), L2 %s bytes (%s), %d race jobs%s", device, seam,
        f"{basis.stock.nbytes:,}", how, f"{basis.window_bytes:,}", window,
        f"{basis.l2_cache_bytes:,}",
        "the caller's figure" if given else "read from the device",
        basis.race_jobs, free)  # fmt: skip
