"""What the release-table scripts share: a JSON table of judged releases, rendered into a docs
page, checked against the registry's version list, and judged one wheel at a time.

Each script (``b12x_releases.py``, ``triton_releases.py``) describes its table in a
:class:`Releases` and supplies the judge: how one release's wheel is read and proven.
Bad input is one line (:class:`TableError`), naming the cause and the fix.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

Verdict = dict[str, object]
ListVersions = Callable[[str], list[str]]
"""Every version of a distribution on the registry, pre-releases included."""
Log = Callable[[str], None]
Judge = Callable[[str, str, Path, Log], Verdict]
"""``(name, version, cache, log)``: the verdict on one release (``error`` set: no verdict)."""


class TableError(Exception):
    """A release table or a release name that cannot be used: one line, the cause and the fix."""


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


PIP_DOWNLOAD = (sys.executable, "-m", "pip", "download", "--quiet", "--no-deps")


def download(
    name: str, version: str, into: Path, log: Log = progress, options: Sequence[str] = ()
) -> Path:
    """The wheel of ``name==version`` (no dependencies) downloaded into ``into``, or the one
    already there; ``options``: more of pip's (e.g. the platform a wheel is for)."""
    stem = name.replace("-", "_")
    found = sorted(into.glob(f"{stem}-{version}-*.whl"))
    if found:
        log(f"  wheel {found[0].name}: in the cache ({found[0].stat().st_size / 1e6:,.1f} MB)")
        return found[0]
    log(f"  downloading {name}=={version} (no dependencies) into {into} ...")
    began = time.perf_counter()
    run = subprocess.run(
        [*PIP_DOWNLOAD, "--only-binary=:all:", *options, "-d", str(into), f"{name}=={version}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise TableError(
            f"pip download {name}=={version} failed: {pip_error(run.stderr)}; fix: check "
            f"that the registry lists it (pip index versions --pre {name}) and can be reached"
        )
    found = sorted(into.glob(f"{stem}-{version}-*.whl"))
    if not found:
        raise TableError(
            f"pip download {name}=={version} left no wheel in {into}; fix: check that "
            "the registry has a wheel of it (pip download --only-binary=:all:)"
        )
    log(
        f"  downloaded {found[0].name}: {found[0].stat().st_size / 1e6:,.1f} MB in "
        f"{time.perf_counter() - began:.1f} s"
    )
    return found[0]


def pip_error(stderr: str) -> str:
    """pip's first ``ERROR:`` line (its cause), on one bounded line; else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    said = (errors or lines[-1:] or ["no message"])[0]
    return said if len(said) <= 300 else said[:297] + "..."


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


@dataclass(frozen=True)
class Releases:
    """One release table: its file, its docs page, its distributions and its judge."""

    description: str
    """``--help``'s first line."""
    script: str
    """How the script is run from the checkout's root, e.g. ``scripts/b12x_releases.py``."""
    packages: tuple[str, ...]
    """The distributions judged: a row's key is ``NAME==VERSION`` with NAME one of these."""
    example: str
    """A release named in fixes, e.g. ``flashinfer-python==0.7.4``."""
    table: Path
    readme: Path
    """The docs page holding the rendered table (the flag keeps its first name, ``--readme``)."""
    marker: str
    """The rendered table's markers in the page: ``<!-- MARKER: ... -->``."""
    cache: Path
    downloads: str
    """What ``--help`` says of the downloads, so that no run of minutes surprises anyone."""
    judge: Judge
    stays: str
    """The verdict of a release the plugin does not install on, e.g. ``falls back``."""
    min_version: str | None = None
    """Discovery's oldest release; ``None``: each distribution's oldest row."""

    @property
    def readme_start(self) -> str:
        return f"<!-- {self.marker}: rendered by {self.script} --readme -->"

    @property
    def readme_end(self) -> str:
        return f"<!-- {self.marker}: end -->"

    def read_table(self, path: Path | None = None) -> dict[str, Verdict]:
        """The table at ``path`` (default: the shipped one), every row checked: NAME==VERSION
        keys, installs and reason. Raises :class:`TableError` naming the file and the row."""
        path = path or self.table
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
            self.key(release, where=f"{path}: row {release[:100]!r}")
            if not isinstance(row, dict) or not isinstance(row.get("installs"), bool):
                raise TableError(f"{path}: row {release!r} has no true/false 'installs'; {fix}")
            if not isinstance(row.get("reason"), str) or not row["reason"]:
                raise TableError(f"{path}: row {release!r} has no 'reason'; {fix}")
        return table

    def write_table(self, table: dict[str, Verdict], path: Path | None = None) -> None:
        """Rows sorted by distribution, then by version (PEP 440 order)."""
        ordered = dict(sorted(table.items(), key=lambda item: self.key(item[0])))
        (path or self.table).write_text(json.dumps(ordered, indent=2) + "\n")

    def split(self, release: str, where: str | None = None) -> tuple[str, str]:
        name, _, version = release.partition("==")
        if name not in self.packages or not version:
            raise TableError(
                f"{where or repr(release[:100])}: not NAME==VERSION with NAME one of "
                f"{', '.join(self.packages)}; fix: write it as, e.g., {self.example}"
            )
        return name, version

    def key(self, release: str, where: str | None = None) -> tuple[str, Version]:
        name, version = self.split(release, where)
        try:
            return name, Version(version)
        except InvalidVersion:
            raise TableError(
                f"{where or repr(release[:100])}: {version[:100]!r} is not a version (PEP 440); "
                "fix: write the release's version as the registry lists it, e.g. "
                f"{self.example.partition('==')[2]}"
            ) from None

    def unjudged(self, table: dict[str, Verdict], list_versions: ListVersions) -> list[str]:
        """Releases on the registry, from the oldest judged (:attr:`min_version`, else each
        distribution's oldest row) on, with no row."""
        missing: list[str] = []
        for name in self.packages:
            rows = [Version(v) for n, v in map(self.split, table) if n == name]
            if self.min_version is not None:
                oldest = Version(self.min_version)
            elif rows:
                oldest = min(rows)
            else:
                continue
            found = sorted({Version(v) for v in list_versions(name)})
            missing += [f"{name}=={v}" for v in found if v >= oldest and v not in rows]
        return missing

    def render_readme(self, table: dict[str, Verdict]) -> str:
        """The rendered table: one line per run of releases that judge alike, oldest first."""
        groups: list[tuple[str, list[str], str, str]] = []
        for release in sorted(table, key=self.key):
            name, version = self.split(release)
            got = table[release]
            verdict = "installs" if got["installs"] else self.stays
            reason = str(got["reason"]).replace(f" {version} ", " X ")
            reason = reason.replace(f" {version}:", " X:")
            if groups and groups[-1][0] == name and groups[-1][2:] == (verdict, reason):
                groups[-1][1].append(version)
            else:
                groups.append((name, [version], verdict, reason))
        lines = [self.readme_start, "| release | verdict | reason |", "|---|---|---|"]
        for name, versions, verdict, reason in groups:
            lines.append(f"| `{name}` {', '.join(versions)} | {verdict} | {reason} |")
        lines.append(self.readme_end)
        return "\n".join(lines)

    def readme_table(self, readme: str) -> str:
        """The rendered table as its page holds it (between its two markers)."""
        start, end = readme.index(self.readme_start), readme.index(self.readme_end)
        return readme[start : end + len(self.readme_end)]

    def main(
        self, argv: Sequence[str] | None = None, list_versions: ListVersions = registry_versions
    ) -> int:
        parser = argparse.ArgumentParser(
            description=self.description,
            epilog=self.downloads,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument(
            "--discover", action="store_true", help="fail on registry releases with no row"
        )
        parser.add_argument(
            "--check", action="store_true", help="judge every row again and compare"
        )
        parser.add_argument("--judge", action="append", default=[], metavar="NAME==VERSION")
        parser.add_argument(
            "--write", action="store_true", help="write the judged rows to the table"
        )
        parser.add_argument(
            "--readme",
            action="store_true",
            help=f"print the table {self.readme.parent.name}/{self.readme.name} holds",
        )
        parser.add_argument("--table", type=Path, default=self.table, help=argparse.SUPPRESS)
        parser.add_argument("--readme-path", type=Path, default=self.readme, help=argparse.SUPPRESS)
        parser.add_argument(
            "--cache",
            type=Path,
            default=self.cache,
            metavar="DIR",
            help=f"where downloads are kept between runs (default: {self.cache})",
        )
        args = parser.parse_args(argv)
        try:
            return self._run(args, list_versions)
        except TableError as error:
            print(f"error: {self.script}: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(
                f"error: {self.script}: interrupted; the table is unchanged, and what was "
                f"downloaded so far stays in {args.cache}; fix: run it again (the cache is "
                "reused)",
                file=sys.stderr,
            )
            return 130

    def _run(self, args: argparse.Namespace, list_versions: ListVersions) -> int:
        table = self.read_table(args.table)
        if args.readme:
            print(self.render_readme(table))
            return 0
        if args.discover:
            return self._discover(table, list_versions)
        releases = list(args.judge) or list(table)
        for release in releases:
            self.key(release)  # every name checked before the first download, and the cache
        args.cache.mkdir(parents=True, exist_ok=True)
        results: dict[str, Verdict] = {}
        began = time.perf_counter()
        for number, release in enumerate(releases, 1):
            progress(f"judging {release} ({number}/{len(releases)}) ...")
            name, version = self.split(release)
            got = results[release] = self.judge(name, version, args.cache, progress)
            progress(
                f"  {release}: {self._said(got)} ({number}/{len(releases)} judged, "
                f"{time.perf_counter() - began:.0f} s so far)"
            )
        for release, got in results.items():
            print(f"{release:32} {self._said(got)}: {got['reason']}")
        failed = [r for r, got in results.items() if got.get("error")]
        if args.write and not failed:
            table |= results
            self.write_table(table, args.table)
            readme = args.readme_path.read_text()
            rendered = self.render_readme(table)
            args.readme_path.write_text(readme.replace(self.readme_table(readme), rendered))
            print(f"wrote {len(results)} rows to {args.table} and {args.readme_path.name}'s table")
        if args.check:
            failed += [r for r in results if results[r] != table.get(r)]
        if failed:
            print(
                f"release matrix: verdicts differ or failed for {', '.join(failed)}",
                file=sys.stderr,
            )
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

    def _said(self, got: Verdict) -> str:
        return "installs" if got["installs"] else self.stays

    def _discover(self, table: dict[str, Verdict], list_versions: ListVersions) -> int:
        missing = self.unjudged(table, list_versions)
        for release in missing:
            print(
                f"{release}: no judged row; judge it and write its row with: "
                f"python {self.script} --judge {release} --write",
                file=sys.stderr,
            )
        if missing:
            print(f"release discovery: {len(missing)} releases unjudged", file=sys.stderr)
            return 1
        print(f"release discovery: every release on the registry has a row ({len(table)} rows)")
        return 0
