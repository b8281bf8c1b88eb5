"""The b12x releases the plugin may meet: each judged on a CPU, and none missed.

``flare_l2evict/tools/b12x_releases.json`` is the one table: a row per published release
of ``b12x`` and of ``flashinfer-python`` (pre-releases included) from the
oldest row on, with its verdict. The table in docs/b12x.md is rendered from it, and
``flare-l2evict check`` says whether the b12x it finds has a row (the table
ships in the package for that).

Judging a release: download its wheel (no dependencies), unpack only its b12x
package, import that b12x in a fresh interpreter (the environment's own b12x
hidden), and run the plugin's seam proof. The verdict is "installs" or "falls
back" with the plugin's own one-line reason.

    python scripts/b12x_releases.py --discover     # every release on the registry has a row
    python scripts/b12x_releases.py --check        # every row still judges the same
    python scripts/b12x_releases.py --judge flashinfer-python==0.7.5 --write  # + docs/b12x.md
    python scripts/b12x_releases.py --readme       # docs/b12x.md's table
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from _releases import Log, Releases, download, progress

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(tempfile.gettempdir()) / "b12x-wheels"
DOWNLOADS = f"""\
downloads:
  --check, --judge and no flag at all judge releases: each one's wheel is
  downloaded (no dependencies) into --cache, about 800 MB for the whole table,
  and kept there between runs; by default the cache is
  {CACHE}
  --discover asks the registry for its version lists only; --readme downloads
  nothing.
"""

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

import flare_l2evict._b12x.provider as provider
import flare_l2evict._b12x.proof as seam

# The release under test is unpacked, not installed: name it in the reasons, wherever
# the reasons read the installed versions from.
for module in (seam, provider):
    if hasattr(module, "versions"):
        module.versions = lambda: (version, None) if layout == "b12x" else (None, version)
try:
    proof = seam.prove_seam()
except seam.InstallError as error:
    print(json.dumps({"installs": False, "reason": str(error)}))
else:
    print(json.dumps({"installs": True, "reason": f"{len(proof.bindings)} extra bindings"}))
"""


def verdict(name: str, version: str, cache: Path, log: Log = progress) -> dict[str, object]:
    wheel = download(name, version, cache, log)
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


RELEASES = Releases(
    description=(__doc__ or "").splitlines()[0],
    script="scripts/b12x_releases.py",
    packages=("b12x", "flashinfer-python"),  # the distributions that ship b12x
    example="flashinfer-python==0.7.4",
    table=ROOT / "flare_l2evict" / "tools" / "b12x_releases.json",
    readme=ROOT / "docs" / "b12x.md",
    marker="b12x-releases",
    cache=CACHE,
    downloads=DOWNLOADS,
    judge=verdict,
    stays="falls back",
)
TABLE = RELEASES.table
read_table = RELEASES.read_table
write_table = RELEASES.write_table
unjudged = RELEASES.unjudged
render_readme = RELEASES.render_readme
readme_table = RELEASES.readme_table
main = RELEASES.main


if __name__ == "__main__":
    raise SystemExit(main())
