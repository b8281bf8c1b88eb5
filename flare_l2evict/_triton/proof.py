"""Prove, before anything changes, that Triton's ``do_bench`` flushes where the plugin can.

Setting two attributes on the active driver instance only helps if every timing path
asks ``runtime.driver.active`` for them each time it runs, and only if that instance is
CUDA's stock driver, untouched by another program. This checks each of those on the
Triton that is here, from its code objects (never its text on disk, which may not be
what runs), and returns a :class:`Verdict`: the proof, or the one-line reason why not.
Changes nothing, and imports Triton only where it is installed.
"""

from __future__ import annotations

import dis
import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._text import described, shown

METHODS = ("get_empty_cache_for_benchmark", "clear_cache")
"""The driver's two methods ``do_bench`` flushes through: make a buffer, then clear it."""

TIMING = ("do_bench", "do_bench_proton", "do_bench_cudagraph_proton")
"""``triton.testing``'s timing functions that flush; the first is required, the others are
checked where this Triton has them (``do_bench_cudagraph`` does not flush)."""

CUDA_DRIVER = "triton.backends.nvidia.driver.CudaDriver"

MARK = "__flare_l2evict__"
"""Attribute set on the plugin's two replacement methods."""

STOCK = "Triton's flush stays stock"

_GLOBALS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_ATTRIBUTES = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


@dataclass(frozen=True)
class TritonProof:
    """What :func:`prove` found; :class:`~.seam.TritonSeam` acts on it alone.

    Invariant: every timing path of this Triton that flushes asks ``config.active`` for
    both :data:`METHODS` when it runs, and ``driver`` was that active instance, of CUDA's
    own class, with neither method set on the instance.
    """

    config: Any
    """``triton.runtime.driver``: the object whose ``.active`` every timing path reads."""
    driver: Any
    """The active driver instance the proof saw: the one an installation patches."""
    version: str | None
    timing: tuple[str, ...]
    """The timing functions proven, :data:`TIMING`'s names that this Triton has."""


@dataclass(frozen=True)
class Verdict:
    """The proof, or ``None`` and why; ``reason`` is one line either way."""

    proof: TritonProof | None
    reason: str


def named(value: object) -> str:
    """A callable's ``module.qualname`` (or its type's), for a one-line reason."""
    target = getattr(value, "__func__", value)
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return shown(f"{module}.{qualname}", 160)


def _chains(code: types.CodeType) -> Iterator[tuple[str, ...]]:
    """Each run of name loads in ``code`` and the code nested in it (``a.b.c`` -> a, b, c)."""
    run: list[str] = []  # a run starts at a global: an attribute of a local is no lookup here
    for instruction in dis.get_instructions(code):
        name, starts = instruction.argval, instruction.opname in _GLOBALS
        if isinstance(name, str) and (starts or (run and instruction.opname in _ATTRIBUTES)):
            if starts:
                if len(run) > 1:
                    yield tuple(run)
                run = []
            run.append(name)
            continue
        if len(run) > 1:
            yield tuple(run)
        run = []
    if len(run) > 1:
        yield tuple(run)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _chains(constant)


def driver_lookups(code: types.CodeType) -> frozenset[tuple[str, str]]:
    """``(root, method)`` for each ``root.driver.active.method`` (or ``driver.active.method``,
    root ``driver``) that ``code`` looks up when it runs: a lookup at call time, never a copy."""
    found: set[tuple[str, str]] = set()
    for chain in _chains(code):
        for at in range(len(chain) - 2):
            if chain[at : at + 2] == ("driver", "active") and at + 2 < len(chain):
                root = chain[0] if at == 1 else "driver" if at == 0 else ""
                if root:
                    found.add((root, chain[at + 2]))
    return frozenset(found)


def function_code(source: str, name: str) -> types.CodeType | None:
    """The code object of the module-level function ``name`` defined in ``source`` (a file's
    text, or the excerpt of it a test feeds), compiled here; ``None`` if it defines none."""
    module = compile(source, f"<{name}>", "exec", dont_inherit=True)
    for constant in module.co_consts:
        if isinstance(constant, types.CodeType) and constant.co_name == name:
            return constant
    return None


def timing_problem(
    name: str, code: types.CodeType, resolve: Callable[[str], object], config: object
) -> str | None:
    """Why the timing function ``name`` (its ``code``) does not flush through ``config``'s
    active driver at call time (``None``: it does). ``resolve`` reads one of its globals."""
    found = driver_lookups(code)
    for method in METHODS:
        roots = {root for root, looked_up in found if looked_up == method}
        if not roots:
            return (
                f"triton.testing.{name} does not ask runtime.driver.active for {method} when "
                f"it runs: this Triton flushes another way; {STOCK}"
            )
        for root in sorted(roots):
            held = resolve(root)
            target = held if root == "driver" else getattr(held, "driver", None)
            if target is not config:
                return (
                    f"triton.testing.{name} reads {root}.driver.active from an object other "
                    f"than triton.runtime.driver: a patch would not reach it; {STOCK}"
                )
    return None


def driver_problem(driver: object, cuda_driver: type) -> str | None:
    """Why the active ``driver`` is not one the plugin patches (``None``: it is): it must be
    ``cuda_driver`` itself (CUDA's stock class), have both methods on the class, hold neither
    on the instance, and take instance attributes."""
    kind = type(driver)
    if kind is not cuda_driver and "proxy" in kind.__qualname__.lower():
        # Triton before 3.5 hands out a LazyProxy: an attribute set on it lands on the driver
        # behind it, but vars() and type() see the proxy, so neither the proof nor the undo
        # would see what was set.
        return (
            f"the active Triton driver is {named(kind)}, a proxy in front of the driver, not "
            f"{CUDA_DRIVER} itself: the plugin patches the driver's own instance only; {STOCK}"
        )
    if kind is not cuda_driver:
        which = "AMD's HIP driver" if "hip" in kind.__qualname__.lower() else "not CUDA's"
        return (
            f"the active Triton driver is {named(kind)} ({which}), not {CUDA_DRIVER}: the "
            f"plugin reads weights on CUDA only; {STOCK}"
        )
    for method in METHODS:
        if not callable(getattr(kind, method, None)):
            return (
                f"the active Triton driver {named(kind)} has no {method}: this Triton flushes "
                f"another way; {STOCK}"
            )
    try:
        held = vars(driver)
    except TypeError:
        return f"the active Triton driver {named(kind)} takes no instance attributes; {STOCK}"
    for method in METHODS:
        if method in held:
            owner = held[method]
            marked = getattr(owner, MARK, False)
            whose = "left by an earlier start-up of this plugin" if marked else "another program's"
            return (
                f"the active Triton driver already carries its own {method} ({named(owner)}, "
                f"{whose}): left alone, {STOCK}"
            )
    return None


def prove(
    config: object,
    timing: Mapping[str, Callable[..., object]],
    cuda_driver: type,
    version: str | None,
) -> Verdict:
    """Check ``timing`` (``triton.testing``'s functions by name) and ``config``'s active
    driver; changes nothing. ``cuda_driver``: the class the active driver must be."""
    if "do_bench" not in timing:
        return Verdict(None, f"triton.testing has no do_bench: nothing to patch; {STOCK}")
    for name, function in timing.items():
        code = getattr(function, "__code__", None)
        if not isinstance(code, types.CodeType):
            return Verdict(None, f"triton.testing.{name} has no Python code to check; {STOCK}")
        space: Mapping[str, object] = getattr(function, "__globals__", {})
        problem = timing_problem(name, code, space.get, config)
        if problem is not None:
            return Verdict(None, problem)
    try:
        driver = config.active  # type: ignore[attr-defined]
    except Exception as error:  # no GPU, or a broken backend: do_bench could not run either
        return Verdict(None, f"Triton has no active driver ({described(error, 200)}); {STOCK}")
    problem = driver_problem(driver, cuda_driver)
    if problem is not None:
        return Verdict(None, problem)
    proof = TritonProof(config, driver, version, tuple(timing))
    paths = ", ".join(proof.timing)
    return Verdict(
        proof,
        f"triton {version or '-'}: {paths} flush through {named(cuda_driver)}'s two methods, "
        "looked up at call time",
    )


def timing_functions(testing: types.ModuleType) -> dict[str, Callable[..., object]]:
    """``testing``'s functions of :data:`TIMING`, by name, where it has them."""
    return {
        name: getattr(testing, name) for name in TIMING if callable(getattr(testing, name, None))
    }


def took(proof: TritonProof, replacements: Mapping[str, object]) -> str | None:
    """Why, after setting them, ``triton.runtime.driver.active`` does not resolve each of
    :data:`METHODS` to the plugin's replacement (``None``: it does): a patch that silently
    does nothing is refused, not kept."""
    for method, replacement in replacements.items():
        try:
            found = getattr(proof.config.active, method, None)
        except Exception as error:
            return f"reading triton.runtime.driver.active raised {described(error, 200)}; {STOCK}"
        if found is not replacement:
            return (
                f"after setting {method} on the active Triton driver, "
                f"triton.runtime.driver.active.{method} is {named(found)}, not the plugin's: "
                f"undone, {STOCK}"
            )
    return None


def _installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # ValueError: a triton module without __spec__
        return "triton" in sys.modules


def prove_triton() -> Verdict:
    """The proof on the Triton installed here. Imports it where it is installed (never
    otherwise) and makes its active driver if none was made yet, as ``do_bench`` would."""
    if not _installed():
        return Verdict(None, "triton is not installed: no do_bench to patch")
    try:
        triton = importlib.import_module("triton")
        testing = importlib.import_module("triton.testing")
        runtime = importlib.import_module("triton.runtime")
        nvidia = importlib.import_module("triton.backends.nvidia.driver")
    except Exception as error:  # a broken install fails in its own ways
        return Verdict(None, f"importing triton raised {described(error, 200)}; {STOCK}")
    version = getattr(triton, "__version__", None)
    cuda_driver = getattr(nvidia, "CudaDriver", None)
    if not isinstance(cuda_driver, type):
        return Verdict(None, f"triton {version} has no {CUDA_DRIVER}; {STOCK}")
    config = getattr(runtime, "driver", None)
    return prove(config, timing_functions(testing), cuda_driver, str(version) if version else None)
