"""``pip install flare-l2evict`` into a server's environment changes nothing of the server's.

Each server is a stand-in: a bare virtual environment whose site-packages
holds metadata-only ``*.dist-info`` folders (METADATA, RECORD, INSTALLER) for
the packages the server runs. pip's resolver reads only that metadata, so
``pip --python <server> install --dry-run --report -`` of this package's
wheel says what a real install would add or replace there. It asks the
package registry (pip's own settings) for the plugin's own dependencies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# pip builds the wheel and resolves it against eleven server stand-ins; two nested pytest runs.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

# What a CUDA torch wheel requires, cut to the packages the assertions are about.
TORCH_REQUIRES = {
    "2.13.0": ["triton==3.7.0", "nvidia-cublas-cu12==12.9.1.4", "filelock", "typing-extensions"],
    "2.12.0": ["triton==3.6.0", "nvidia-cublas-cu12==12.8.4.1", "filelock", "typing-extensions"],
    "2.10.0": ["triton==3.5.1", "nvidia-cublas-cu12==12.8.4.1", "filelock", "typing-extensions"],
}
TORCH_DEPENDENCIES = {"filelock": "3.20.0", "typing-extensions": "4.15.0"}


def cuda_torch_stand_in(version: str) -> dict[str, str]:
    """A CUDA torch and what it pulled in, as the server has them installed."""
    pins = dict(r.split("==") for r in TORCH_REQUIRES[version] if "==" in r)
    return {"torch": version, **pins, **TORCH_DEPENDENCIES}


# A serving stack around the GPU libraries (a vLLM-like image's pydantic and safetensors).
SERVING = {"pydantic": "2.9.2", "safetensors": "0.6.2", "pluggy": "1.6.0"}
# standalone b12x 1.5.1's own requirements, installed with it.
B12X_STACK = {"b12x": "1.5.1", "nvidia-cutlass-dsl": "4.8.0", "cuda-python": "13.0.3"}

SERVER_STAND_INS: dict[str, dict[str, str]] = {
    "torch 2.13 + flashinfer-python 0.7.4": {
        **cuda_torch_stand_in("2.13.0"),
        **SERVING,
        "flashinfer-python": "0.7.4",
    },
    "torch 2.12 + flashinfer-python 0.7.2": {
        **cuda_torch_stand_in("2.12.0"),
        **SERVING,
        "flashinfer-python": "0.7.2",
    },
    "torch 2.13 + standalone b12x 1.5.1, no FlashInfer": {
        **cuda_torch_stand_in("2.13.0"),
        **SERVING,
        **B12X_STACK,
    },
    "torch 2.12 + a FlashInfer built from a fork": {
        **cuda_torch_stand_in("2.12.0"),
        **SERVING,
        "flashinfer-python": "0.7.1+fork.f2868d9a",
    },
    "torch 2.10 + flashinfer-python 0.6.18": {
        **cuda_torch_stand_in("2.10.0"),
        **SERVING,
        "flashinfer-python": "0.6.18",
    },
    "bare torch 2.13 + flashinfer-python 0.7.4": {
        **cuda_torch_stand_in("2.13.0"),
        "flashinfer-python": "0.7.4",
    },
}
"""The servers an operator installs into (issue 20's rows, plus a bare one)."""

HOST_STACK = re.compile(r"^(torch|flashinfer-python|b12x|triton|nvidia-.*|cuda-.*)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Report:
    """What ``pip install --dry-run --report`` would install, by canonical name."""

    installs: dict[str, str] = field(default_factory=dict)


def changes_to(server: Mapping[str, str], report: Report) -> list[str]:
    """Every package the install would add from the host's stack, or replace on the server."""
    return sorted(
        f"{name} {server.get(name, 'absent')} -> {version}"
        for name, version in report.installs.items()
        if name in server or HOST_STACK.match(name)
    )


def _write_stand_in(site: Path, name: str, version: str) -> None:
    """A metadata-only installed distribution, as pip leaves one minus its files."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    requires = TORCH_REQUIRES.get(version, []) if name == "torch" else []
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(metadata) + "\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(
        "".join(f"{info.name}/{f},," + "\n" for f in ("METADATA", "INSTALLER", "RECORD"))
    )


def server_stand_in(root: Path, packages: Mapping[str, str]) -> Path:
    """A server environment stand-in: a venv without pip holding ``packages`` as metadata.

    Returns its interpreter, for ``pip --python``: pip then resolves against
    exactly that environment's installed distributions.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for name, version in packages.items():
        _write_stand_in(Path(purelib), name, version)
    return python


def dry_run(python: Path, constraint: Path | None, *, wheel: Path) -> Report:
    """The report of ``pip install <wheel>`` (with ``-c constraint`` where given)."""
    pinned = ["--constraint", str(constraint)] if constraint is not None else []
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--dry-run",
            "--quiet",
            "--report",
            "-",
            *pinned,
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report: dict[str, Any] = json.loads(run.stdout)
    return Report(
        {
            _canonical(item["metadata"]["name"]): item["metadata"]["version"]
            for item in report["install"]
        }
    )


_TRUE = {"1", "true", "yes", "on"}


def registry_problem() -> str | None:
    """Why pip cannot reach a package registry from here, or None where it can.

    The build (its isolated build environment) and every dry run ask the
    registry pip is configured with; ``pip index versions`` of one of the
    plugin's own dependencies is the smallest question of the same kind.
    """
    if os.environ.get("PIP_NO_INDEX", "").strip().lower() in _TRUE:
        return "PIP_NO_INDEX is set"
    try:
        probe = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", "pluggy"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    except subprocess.TimeoutExpired:
        return "pip index versions pluggy timed out after 60 s"
    if probe.returncode != 0 or "Available versions:" not in probe.stdout:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"pip index versions pluggy failed ({last[:200]})"
    return None


def needs_registry() -> None:
    """Skip, in one line naming what is missing, where no registry answers; under CI, fail.

    CI (``CI`` set true, as GitHub Actions and .ci/run set it) must run these
    tests, so there a missing registry is an error, never a quiet skip.
    """
    problem = registry_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").strip().lower() in _TRUE:
        pytest.fail(f"CI is set, and these tests need the package registry: {problem}")
    pytest.skip(
        f"needs the package registry (pip builds the wheel and resolves the plugin's "
        f"dependencies): {problem}"
    )


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This package's wheel, built once from a copy of the tree (the build writes in-tree)."""
    needs_registry()
    source = tmp_path_factory.mktemp("source") / "flare-l2evict"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", ".ci", "*.egg-info", "build", "dist"),
    )
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("flare_l2evict-*.whl")
    return built


CONTROLS: dict[str, dict[str, str]] = {
    # pydantic below the plugin's floor: pip must replace it, and changes_to must say so.
    "server with pydantic 2.5.0 (control)": {
        **cuda_torch_stand_in("2.13.0"),
        "pydantic": "2.5.0",
        "flashinfer-python": "0.7.4",
    },
}


ISSUE_ROWS = list(SERVER_STAND_INS)[:5]
"""The servers measured in issue 20, where a plain install changed the server."""
PINNED = " (pinned)"
"""Suffix of a report made with the server's own versions as constraints (README's command)."""


@pytest.fixture(scope="session")
def reports(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Iterator[dict[str, Report]]:
    """Every server's dry-run reports, asked of the registry in parallel (it is network-bound).

    Plain ``pip install`` for the issue's servers and the control; with the
    server's ``pip list --format=freeze`` as constraints for every server.
    """
    servers = {**SERVER_STAND_INS, **CONTROLS}
    jobs: dict[str, tuple[Path, Path | None]] = {}
    for name, packages in servers.items():
        root = tmp_path_factory.mktemp("server")
        python = server_stand_in(root / "env", packages)
        if name in ISSUE_ROWS or name in CONTROLS:
            jobs[name] = (python, None)
        if name in SERVER_STAND_INS:
            frozen = root / "server-constraints.txt"
            frozen.write_text("".join(f"{n}=={v}\n" for n, v in packages.items()))
            jobs[name + PINNED] = (python, frozen)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(dry_run, *job, wheel=wheel) for name, job in jobs.items()}
        yield {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("server", ISSUE_ROWS)
def test_installing_into_a_server_changes_nothing_of_it(
    reports: dict[str, Report], server: str
) -> None:
    report = reports[server]
    assert changes_to(SERVER_STAND_INS[server], report) == []
    assert report.installs.get("flare-l2evict") is not None


@pytest.mark.parametrize("server", list(SERVER_STAND_INS))
def test_installing_pinned_to_the_servers_versions_changes_nothing_of_it(
    reports: dict[str, Report], server: str
) -> None:
    """The README's command for production images: the server's versions as constraints."""
    report = reports[server + PINNED]
    assert changes_to(SERVER_STAND_INS[server], report) == []
    assert report.installs.get("flare-l2evict") is not None


def test_a_server_without_pluggy_gets_only_the_plugins_own_dependencies(
    reports: dict[str, Report],
) -> None:
    """The bare server lacks pluggy, pydantic and safetensors: those come, nothing else of note."""
    installs = reports["bare torch 2.13 + flashinfer-python 0.7.4" + PINNED].installs
    assert {"flare-l2evict", "pluggy", "pydantic", "safetensors"} <= set(installs)
    assert not [name for name in installs if HOST_STACK.match(name)]


def test_the_stand_ins_are_what_pip_resolves_against(reports: dict[str, Report]) -> None:
    """Control: a stand-in pydantic below the floor is replaced, and the check names it.

    Were the stand-ins not honoured, pydantic would count as absent and the
    change would not read ``2.5.0 -> ...``; nor would the rows above mean anything.
    """
    server = CONTROLS["server with pydantic 2.5.0 (control)"]
    found = changes_to(server, reports["server with pydantic 2.5.0 (control)"])
    assert any(f.startswith("pydantic 2.5.0 -> 2.") for f in found), found
    # The servers that have pydantic 2.9.2 keep it, which pip only knows from the stand-in.
    assert "pydantic" not in reports["torch 2.13 + flashinfer-python 0.7.4"].installs


def test_the_stand_in_environment_holds_only_its_packages(tmp_path: Path) -> None:
    python = server_stand_in(tmp_path / "env", {"torch": "2.13.0", "triton": "3.7.0"})
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert {d["name"]: d["version"] for d in json.loads(listed)} == {
        "torch": "2.13.0",
        "triton": "3.7.0",
    }
    assert sysconfig.get_paths()["purelib"] not in listed


def test_the_wheel_ships_what_check_reads(wheel: Path) -> None:
    """``check`` looks the b12x provider up in its judged table, and the Triton wing the Triton
    here in its own: both must be in the wheel."""
    names = zipfile.ZipFile(wheel).namelist()
    assert "flare_l2evict/tools/b12x_releases.json" in names
    assert "flare_l2evict/tools/triton_releases.json" in names
    assert "flare_l2evict/py.typed" in names


@pytest.fixture(scope="module")
def without_registry() -> dict[str, subprocess.CompletedProcess[str]]:
    """One of these tests run by pytest with ``PIP_NO_INDEX=1``, by ``CI`` (unset, true).

    The two runs start together: each spends most of its time importing.
    """
    argv = [
        sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
        f"{__file__}::test_the_wheel_ships_what_check_reads",
    ]  # fmt: skip
    started = {
        ci: subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PIP_NO_INDEX": "1", "CI": ci},
        )
        for ci in ("", "true")
    }
    done = {}
    for ci, process in started.items():
        out, err = process.communicate(timeout=300)
        done[ci] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


@pytest.mark.parametrize(("ci", "outcome"), [("", "skipped"), ("true", "error")])
def test_without_the_registry_these_tests_skip_in_one_line_and_ci_fails(
    without_registry: dict[str, subprocess.CompletedProcess[str]], ci: str, outcome: str
) -> None:
    """``PIP_NO_INDEX=1``: a skip naming what is missing; with ``CI=true``, an error instead."""
    done = without_registry[ci]
    assert f"1 {outcome}" in done.stdout, done.stdout[-3000:]
    if outcome == "skipped":
        assert done.returncode == 0
        assert (
            "needs the package registry (pip builds the wheel and resolves the plugin's "
            "dependencies): PIP_NO_INDEX is set"
        ) in done.stdout
    else:
        assert done.returncode != 0
        assert "CI is set, and these tests need the package registry: PIP_NO_INDEX is set" in (
            done.stdout
        )
