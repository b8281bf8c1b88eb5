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

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

PACKAGES = ("b12x", "flashinfer-python")
"""The distributions that ship b12x."""
TABLE = Path(__file__).resolve().parents[1] / "flare_l2evict" / "tools" / "b12x_releases.json"
SCRIPT = "scripts/b12x_releases.py"
README = Path(__file__).resolve().parents[1] / "docs" / "b12x.md"
"""The page that holds the rendered table (the flags keep their first name, ``--readme``)."""
README_START = "<!-- b12x-releases: rendered by scripts/b12x_releases.py --readme -->"
README_END = "<!-- b12x-releases: end -->"

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
"""What ``--help`` says of the downloads, so that no run of a few minutes surprises anyone."""

Verdict = dict[str, object]
ListVersions = Callable[[str], list[str]]
"""Every version of a distribution on the registry, pre-releases included."""


class TableError(Exception):
    """A release table or a release name that cannot be used: one line, the cause and the fix."""


def read_table(path: Path = TABLE) -> dict[str, Verdict]:
    """The table at ``path``, every row checked: NAME==VERSION keys, installs and reason.

    Raises :class:`TableError` naming the file and the first bad row.
    """
    fix = f"fix: restore it (git checkout {path.name}) or correct the row named"
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise TableError(
            f"{path}: not a readable JSON release table ({type(error).__name__}: "
            f"{' '.join(str(error).split())[:200]}); {fix}"
        ) from None
    if not isinstance(table, dict):
        raise TableError(f"{path}: a JSON {type(table).__name__}, not an object of rows; {fix}")
    for release, row in table.items():
        _key(release, where=f"{path}: row {release[:100]!r}")
        if not isinstance(row, dict) or not isinstance(row.get("installs"), bool):
            raise TableError(f"{path}: row {release!r} has no true/false 'installs'; {fix}")
        if not isinstance(row.get("reason"), str) or not row["reason"]:
            raise TableError(f"{path}: row {release!r} has no 'reason'; {fix}")
    return table


def write_table(table: dict[str, Verdict], path: Path = TABLE) -> None:
    """Rows sorted by distribution, then by version (PEP 440 order)."""
    ordered = dict(sorted(table.items(), key=lambda item: _key(item[0])))
    path.write_text(json.dumps(ordered, indent=2) + "\n")


def _split(release: str, where: str | None = None) -> tuple[str, str]:
    name, _, version = release.partition("==")
    if name not in PACKAGES or not version:
        raise TableError(
            f"{where or repr(release[:100])}: not NAME==VERSION with NAME one of "
            f"{', '.join(PACKAGES)}; fix: write it as, e.g., flashinfer-python==0.7.4"
        )
    return name, version


def _key(release: str, where: str | None = None) -> tuple[str, Version]:
    name, version = _split(release, where)
    try:
        return name, Version(version)
    except InvalidVersion:
        raise TableError(
            f"{where or repr(release[:100])}: {version[:100]!r} is not a version (PEP 440); "
            "fix: write the release's version as the registry lists it, e.g. 0.7.2rc6"
        ) from None


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


_PIP_DOWNLOAD = [
    sys.executable,
    "-m",
    "pip",
    "download",
    "--quiet",
    "--no-deps",
    "--only-binary=:all:",
]


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _wheel(name: str, version: str, cache: Path, log: Callable[[str], None] = _progress) -> Path:
    stem = name.replace("-", "_")
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if found:
        log(f"  wheel {found[0].name}: in the cache ({found[0].stat().st_size / 1e6:,.1f} MB)")
    else:
        log(f"  downloading {name}=={version} (no dependencies) into {cache} ...")
        began = time.perf_counter()
        run = subprocess.run(
            [*_PIP_DOWNLOAD, "-d", str(cache), f"{name}=={version}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            raise TableError(
                f"pip download {name}=={version} failed: {_pip_error(run.stderr)}; fix: check "
                f"that the registry lists it (pip index versions --pre {name}) and can be reached"
            )
        found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
        if not found:
            raise TableError(
                f"pip download {name}=={version} left no wheel in {cache}; fix: check that "
                "the registry has a wheel of it (pip download --only-binary=:all:)"
            )
        log(
            f"  downloaded {found[0].name}: {found[0].stat().st_size / 1e6:,.1f} MB in "
            f"{time.perf_counter() - began:.1f} s"
        )
    return found[0]


def _pip_error(stderr: str) -> str:
    """pip's first ``ERROR:`` line (its cause), on one bounded line; else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    said = (errors or lines[-1:] or ["no message"])[0]
    return said if len(said) <= 300 else said[:297] + "..."


def verdict(
    name: str, version: str, cache: Path, log: Callable[[str], None] = _progress
) -> dict[str, object]:
    wheel = _wheel(name, version, cache, log)
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


def registry_versions(name: str) -> list[str]:
    """What ``pip index versions --pre`` lists for ``name`` (pip's own registry settings)."""
    run = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "--pre", name],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    for line in run.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.partition(":")[2].split(",") if v.strip()]
    raise SystemExit(f"error: pip index versions {name} listed no versions: {run.stdout!r}")


def unjudged(table: dict[str, Verdict], list_versions: ListVersions) -> list[str]:
    """Releases on the registry, at or above each distribution's oldest row, with no row."""
    missing: list[str] = []
    for name in PACKAGES:
        rows = [Version(v) for n, v in map(_split, table) if n == name]
        if not rows:
            continue
        oldest = min(rows)
        found = sorted({Version(v) for v in list_versions(name)})
        missing += [f"{name}=={v}" for v in found if v >= oldest and v not in rows]
    return missing


def render_readme(table: dict[str, Verdict]) -> str:
    """The rendered table: one line per run of releases that judge alike, oldest first."""
    groups: list[tuple[str, list[str], str, str]] = []
    for release in sorted(table, key=_key):
        name, version = _split(release)
        got = table[release]
        verdict = "installs" if got["installs"] else "falls back"
        reason = str(got["reason"]).replace(f" {version} ", " X ")
        if groups and groups[-1][0] == name and groups[-1][2:] == (verdict, reason):
            groups[-1][1].append(version)
        else:
            groups.append((name, [version], verdict, reason))
    lines = [README_START, "| release | verdict | reason |", "|---|---|---|"]
    for name, versions, verdict, reason in groups:
        lines.append(f"| `{name}` {', '.join(versions)} | {verdict} | {reason} |")
    lines.append(README_END)
    return "\n".join(lines)


def readme_table(readme: str) -> str:
    """The rendered table as its page holds it (between its two markers)."""
    start, end = readme.index(README_START), readme.index(README_END)
    return readme[start : end + len(README_END)]


def main(argv: Sequence[str] | None = None, list_versions: ListVersions = registry_versions) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog=DOWNLOADS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--discover", action="store_true", help="fail on registry releases with no row"
    )
    parser.add_argument("--check", action="store_true", help="judge every row again and compare")
    parser.add_argument("--judge", action="append", default=[], metavar="NAME==VERSION")
    parser.add_argument("--write", action="store_true", help="write the judged rows to the table")
    parser.add_argument("--readme", action="store_true", help="print the table docs/b12x.md holds")
    parser.add_argument("--table", type=Path, default=TABLE, help=argparse.SUPPRESS)
    parser.add_argument("--readme-path", type=Path, default=README, help=argparse.SUPPRESS)
    parser.add_argument(
        "--cache",
        type=Path,
        default=CACHE,
        metavar="DIR",
        help=f"where downloaded wheels are kept between runs (default: {CACHE})",
    )
    args = parser.parse_args(argv)
    try:
        return _run(args, list_versions)
    except TableError as error:
        print(f"error: {SCRIPT}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"error: {SCRIPT}: interrupted; the table is unchanged, and the wheels downloaded "
            f"so far stay in {args.cache}; fix: run it again (the cache is reused)",
            file=sys.stderr,
        )
        return 130


def _run(args: argparse.Namespace, list_versions: ListVersions) -> int:
    table = read_table(args.table)
    if args.readme:
        print(render_readme(table))
        return 0
    if args.discover:
        missing = unjudged(table, list_versions)
        for release in missing:
            print(
                f"{release}: no judged row; judge it and write its row with: "
                f"python {SCRIPT} --judge {release} --write",
                file=sys.stderr,
            )
        if missing:
            print(f"release discovery: {len(missing)} releases unjudged", file=sys.stderr)
            return 1
        print(f"release discovery: every release on the registry has a row ({len(table)} rows)")
        return 0
    releases = list(args.judge) or list(table)
    for release in releases:
        _key(release)  # every name checked before the first download, and before the cache
    args.cache.mkdir(parents=True, exist_ok=True)
    results: dict[str, Verdict] = {}
    began = time.perf_counter()
    for number, release in enumerate(releases, 1):
        _progress(f"judging {release} ({number}/{len(releases)}) ...")
        got = results[release] = verdict(*_split(release), args.cache)
        said = "installs" if got["installs"] else "falls back"
        _progress(
            f"  {release}: {said} ({number}/{len(releases)} judged, "
            f"{time.perf_counter() - began:.0f} s so far)"
        )
    for release, got in results.items():
        print(f"{release:32} {'installs' if got['installs'] else 'falls back'}: {got['reason']}")
    failed = [r for r, got in results.items() if got.get("error")]
    if args.write and not failed:
        table |= results
        write_table(table, args.table)
        readme = args.readme_path.read_text()
        args.readme_path.write_text(readme.replace(readme_table(readme), render_readme(table)))
        print(f"wrote {len(results)} rows to {args.table} and {args.readme_path.name}'s table")
    if args.check:
        failed += [r for r in results if results[r] != table.get(r)]
    if failed:
        print(f"release matrix: verdicts differ or failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    if args.check:
        print(f"release matrix: {len(results)} releases judged as recorded")
    else:
        # Nothing was compared: say only what was done (--check compares with the table).
        print(
            f"release matrix: {len(results)} releases judged, not compared with the table "
            "(--check compares them)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
