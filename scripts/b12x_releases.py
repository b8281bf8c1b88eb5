"""The seam verdict against every published b12x release the plugin may meet, on a CPU.

For each release: download its wheel (no dependencies), unpack only its b12x
package, import that b12x in a fresh interpreter (the environment's own
b12x hidden), and run :func:`flare_l2evict.prove_seam`. The verdict is
"installs" or "falls back" with the plugin's own one-line reason. ``--check``
compares with ``scripts/b12x_releases.json`` and exits 1 on any difference;
``--markdown`` prints the README's table.

    python scripts/b12x_releases.py --check [--markdown] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

RELEASES: list[tuple[str, str]] = [
    *(("b12x", v) for v in ("1.2.0", "1.2.1", "1.2.2", "1.2.3", "1.2.4", "1.2.5", "1.2.6")),
    *(("b12x", v) for v in ("1.2.8", "1.3.0", "1.5.0", "1.5.1")),
    *(("flashinfer-python", v) for v in ("0.7.0", "0.7.0.post1", "0.7.1", "0.7.2")),
    *(("flashinfer-python", v) for v in ("0.7.2.post1", "0.7.4")),
]
EXPECTED = Path(__file__).with_suffix(".json")

_PROBE = r"""
import importlib.util, json, sys
from pathlib import Path

root, layout, name, version = sys.argv[1:5]
for mod in [m for m in sys.modules if m == "b12x" or m.startswith("b12x.")]:
    del sys.modules[mod]
if layout == "flashinfer-python":
    package = Path(root) / "flashinfer" / "experimental" / "b12x"
    if not (package / "_api.py").is_file():
        print(json.dumps({"installs": False, "reason": "ships no b12x package"}))
        raise SystemExit(0)
    # What flashinfer's own top-level ``b12x`` shim does, pointed at this release.
    spec = importlib.util.spec_from_file_location(
        "b12x", package / "_api.py", submodule_search_locations=[str(package)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["b12x"] = module
    spec.loader.exec_module(module)
else:
    sys.path.insert(0, root)

import flare_l2evict._seam as seam

# The release under test is unpacked, not installed: name it in the reasons.
seam.versions = lambda: (version, None) if layout == "b12x" else (None, version)
try:
    proof = seam.prove_seam()
except seam.InstallError as error:
    print(json.dumps({"installs": False, "reason": str(error)}))
else:
    print(json.dumps({"installs": True, "reason": f"{len(proof.bindings)} extra bindings"}))
"""


_PIP_DOWNLOAD = [
    sys.executable,
    "-m",
    "pip",
    "download",
    "--quiet",
    "--no-deps",
    "--only-binary=:all:",
]


def _wheel(name: str, version: str, cache: Path) -> Path:
    stem = name.replace("-", "_")
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if not found:
        subprocess.run(
            [*_PIP_DOWNLOAD, "-d", str(cache), f"{name}=={version}"],
            check=True,
        )
        found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    return found[0]


def verdict(name: str, version: str, cache: Path) -> dict[str, object]:
    wheel = _wheel(name, version, cache)
    prefix = "b12x/" if name == "b12x" else "flashinfer/experimental/b12x/"
    with tempfile.TemporaryDirectory() as root, zipfile.ZipFile(wheel) as archive:
        archive.extractall(root, [m for m in archive.namelist() if m.startswith(prefix)])
        run = subprocess.run(
            [sys.executable, "-c", _PROBE, root, name, name, version],
            capture_output=True,
            text=True,
            timeout=300,
        )
    if run.returncode != 0:
        tail = " ".join(run.stderr.strip().splitlines()[-1:])
        return {"installs": False, "reason": f"import failed: {tail}", "error": True}
    verdict: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the expected verdicts")
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    parser.add_argument("--write", action="store_true", help="record these verdicts as expected")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "b12x-wheels")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    results = {f"{n}=={v}": verdict(n, v, args.cache) for n, v in RELEASES}
    if args.write:
        EXPECTED.write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown:
        print("| release | verdict | reason |\n|---|---|---|")
        for release, got in results.items():
            shown = "installs" if got["installs"] else "falls back"
            print(f"| `{release}` | {shown} | {got['reason']} |")
    else:
        for release, got in results.items():
            print(
                f"{release:32} {'installs' if got['installs'] else 'falls back'}: {got['reason']}"
            )
    failed = [r for r, got in results.items() if got.get("error")]
    if args.check:
        expected = json.loads(EXPECTED.read_text())
        failed += [r for r in results if results[r] != expected.get(r)]
    if failed:
        print(f"release matrix: verdicts differ or failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"release matrix: {len(results)} releases, verdicts as expected")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
