"""The Triton releases the plugin may meet: each judged by the seam proof, and none missed.

``flare_l2evict/tools/triton_releases.json`` is the one table: a row per published
release of ``triton`` (pre-releases included) from 3.0.0 on, with its verdict. The table
in docs/triton.md is rendered from it, and the runtime looks a Triton up in it
(``flare_l2evict._triton.table.judged``); a release with no row is judged by the same
proof where it runs.

Judging a release: download its wheel (manylinux x86_64, CPython 3.12, no dependencies),
keep only the three source files the proof reads (``triton/testing.py``,
``triton/backends/nvidia/driver.py``, ``triton/runtime/driver.py``) and delete the wheel,
then run ``flare_l2evict._triton.proof.prove`` on them: the timing functions compiled from
that ``testing.py``, reading a ``DriverConfig`` run from that ``runtime/driver.py``, whose
driver is a stand-in with the methods that ``CudaDriver`` defines. The verdict is
"installs" or "stays stock" with the proof's own one-line reason.

    python scripts/triton_releases.py --discover     # every release on the registry has a row
    python scripts/triton_releases.py --check        # every row still judges the same
    python scripts/triton_releases.py --judge triton==3.9.0 --write  # + docs/triton.md
    python scripts/triton_releases.py --readme       # docs/triton.md's table
"""

from __future__ import annotations
import __future__

import ast
import os
import tempfile
import types
import zipfile
from collections.abc import Callable
from pathlib import Path

from _releases import Log, Releases, Verdict, download, progress

from flare_l2evict._text import described
from flare_l2evict._triton.proof import CUDA_DRIVER, METHODS, STOCK, TIMING, function_code, prove

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(tempfile.gettempdir()) / "triton-sources"
TESTING, NVIDIA, RUNTIME = (
    "triton/testing.py",
    "triton/backends/nvidia/driver.py",
    "triton/runtime/driver.py",
)
"""The files the proof reads: the timing functions, CUDA's driver class, the driver config."""
WHEEL = (
    *("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64"),
    *("--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"),
    *("--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3"),
)
"""pip's options for the wheel judged, whatever this machine is: Linux x86_64, CPython 3.12."""
DOWNLOADS = f"""\
downloads:
  --check, --judge and no flag at all judge releases: each one's wheel (150-400
  MB, no dependencies) is downloaded into a temporary folder in --cache, its three
  source files the proof reads are kept there (about 100 kB a release) and the
  wheel is deleted; by default the cache is
  {CACHE}
  --discover asks the registry for its version list only; --readme downloads
  nothing.
"""


def sources(version: str, cache: Path, log: Log = progress) -> Path:
    """The folder holding the files the proof reads of ``triton==version`` (those its wheel
    has), taken from its wheel the first time and kept in ``cache``."""
    folder = cache / f"triton-{version}"
    if folder.is_dir():
        log(f"  sources of triton=={version}: in the cache ({folder})")
        return folder
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as scratch:
        wheel = download("triton", version, Path(scratch), log, WHEEL)
        unpacked = Path(scratch) / "sources"
        with zipfile.ZipFile(wheel) as archive:
            kept = [name for name in (TESTING, NVIDIA, RUNTIME) if name in archive.namelist()]
            archive.extractall(unpacked, kept)
        wheel.unlink()  # hundreds of MB: gone before the next release is downloaded
        unpacked.mkdir(exist_ok=True)
        os.replace(unpacked, folder)  # whole or absent: an interrupt leaves no half folder
    log(f"  kept {', '.join(kept) or 'none'} of its files in {folder}; deleted the wheel")
    return folder


def _read(folder: Path, name: str) -> str | None:
    path = folder / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def verdict(name: str, version: str, cache: Path, log: Log = progress) -> Verdict:
    folder = sources(version, cache, log)
    return judge_sources(
        version, _read(folder, TESTING), _read(folder, NVIDIA), _read(folder, RUNTIME)
    )


def judge_sources(
    version: str, testing: str | None, nvidia: str | None, runtime: str | None
) -> Verdict:
    """The seam proof on the texts of one Triton's three files (``None``: the wheel has none).

    ``error`` is set where a file could not be read as Python at all: no verdict then.
    """

    def stays(reason: str, error: bool = False) -> Verdict:
        return {"installs": False, "reason": reason} | ({"error": True} if error else {})

    if testing is None or runtime is None:
        missing = TESTING if testing is None else RUNTIME
        return stays(f"triton {version} ships no {missing}: no do_bench to patch; {STOCK}")
    try:
        cuda = _cuda_driver(nvidia)
        if cuda is None:
            return stays(f"triton {version} has no {CUDA_DRIVER}; {STOCK}")
        config = _driver_config(runtime, cuda)
        timing = _timing(testing, config)
    except Exception as error:  # not Python this interpreter reads, or a config it cannot run
        return stays(f"triton {version}: the judge could not run it ({described(error)})", True)
    got = prove(config, timing, cuda, version)
    return {"installs": got.proof is not None, "reason": got.reason}


def _defines(method: str) -> Callable[..., object]:
    def defined(*args: object) -> object:
        raise AssertionError(f"the judge's CudaDriver stand-in ran {method}")

    return defined


def _cuda_driver(nvidia: str | None) -> type | None:
    """A stand-in for ``CudaDriver``, named as the real one and with those of the two flush
    methods that its class body defines; ``None`` where the file defines no such class."""
    if nvidia is None:
        return None
    module, _, name = CUDA_DRIVER.rpartition(".")
    for node in ast.parse(nvidia).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            defined = {
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            methods = {method: _defines(method) for method in METHODS if method in defined}
            return type(name, (), {"__module__": module, **methods})
    return None


def _runs_here(node: ast.stmt) -> bool:
    """Whether a top-level statement of ``runtime/driver.py`` runs under the judge: every
    statement except imports of Triton's own modules (stood in for)."""
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and not (node.module or "").startswith("triton")
    if isinstance(node, ast.Import):
        return not any(alias.name.startswith("triton") for alias in node.names)
    return True


def _driver_config(runtime: str, cuda: type) -> object:
    """A fresh ``DriverConfig`` of this ``runtime/driver.py`` (run as module
    ``triton.runtime.driver``), whose ``_create_driver`` makes a ``cuda`` instance."""
    tree = ast.parse(runtime)
    stood_in = {
        (alias.asname or alias.name).partition(".")[0]
        for node in tree.body
        if not _runs_here(node) and isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    tree.body = [node for node in tree.body if _runs_here(node)]
    space: dict[str, object] = {"__name__": "triton.runtime.driver"}
    space |= {name: object for name in stood_in}  # e.g. DriverBase, as an annotation
    # Annotations stay unevaluated: the names they use are Triton's, stood in for.
    flags = __future__.annotations.compiler_flag
    exec(compile(tree, RUNTIME, "exec", flags, dont_inherit=True), space)
    kind = space.get("DriverConfig")
    if not isinstance(kind, type) or not isinstance(space.get("driver"), kind):
        raise LookupError(f"{RUNTIME} makes no module-level driver = DriverConfig()")
    # Looked up by name when the driver is first made: the stand-in is made instead.
    space["_create_driver"] = cuda
    return kind()


def _timing(testing: str, config: object) -> dict[str, Callable[..., object]]:
    """``testing.py``'s functions of :data:`TIMING` that it defines, compiled here with the
    module-level globals that bind Triton's runtime (or its driver config) standing for
    ``config``: what each looks up at call time is what the proof reads."""
    runtime = types.SimpleNamespace(driver=config)
    # triton.runtime's ``driver`` is runtime/driver.py's config (it shadows the submodule).
    bound = {"triton.runtime": runtime, "triton.runtime.driver": config}
    bound["triton.runtime.driver.driver"] = config
    space: dict[str, object] = {}
    for node in ast.parse(testing).body:
        if isinstance(node, ast.ImportFrom) and node.level in (0, 1):
            # testing.py is triton.testing: ``from . import x`` imports triton.x
            module = ".".join(filter(None, ["triton" if node.level else "", node.module or ""]))
            for alias in node.names:
                if f"{module}.{alias.name}" in bound:
                    space[alias.asname or alias.name] = bound[f"{module}.{alias.name}"]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "triton.runtime" and alias.asname:
                    space[alias.asname] = runtime
    timing: dict[str, Callable[..., object]] = {}
    for name in TIMING:
        code = function_code(testing, name)
        if code is not None:
            timing[name] = types.FunctionType(code, space, name)
    return timing


RELEASES = Releases(
    description=(__doc__ or "").splitlines()[0],
    script="scripts/triton_releases.py",
    packages=("triton",),
    example="triton==3.9.0",
    table=ROOT / "flare_l2evict" / "tools" / "triton_releases.json",
    readme=ROOT / "docs" / "triton.md",
    marker="triton-releases",
    cache=CACHE,
    downloads=DOWNLOADS,
    judge=verdict,
    stays="stays stock",
    min_version="3.0.0",
)

if __name__ == "__main__":
    raise SystemExit(RELEASES.main())
