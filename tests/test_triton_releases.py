"""The Triton release table: rendered into docs/triton.md, every registry release from 3.0.0 on
has a row, each row is the seam proof's verdict on that release's source files, and the
runtime's lookup reads it.

Case -> outcome:

- the docs page's table -> the table rendered from the JSON, byte for byte;
- the registry's list as recorded -> every release has a row; a row removed, or a release
  newer than the table -> discovery fails with one line naming it and the command to judge it;
  releases before 3.0.0 -> never asked for;
- Triton 3.6's ``do_bench``, ``CudaDriver`` and ``DriverConfig`` (vendored) -> installs; 3.4's
  ``DriverConfig`` (vendored, a ``LazyProxy``) -> stays stock, named; a ``do_bench`` that
  zeroes its own buffer (as 3.2's), a ``CudaDriver`` without ``clear_cache``, or a module
  reading another runtime -> stays stock, each with the proof's reason;
- ``--judge --write`` from sources in the cache -> the row and the page, no download;
  ``--check`` -> the same verdict, or a flipped row caught;
- ``judged(version)`` -> the shipped row, ``None`` for a version with none, one line for a
  truncated table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.scripts import discovery_without, script
from support.triton_stand_in import excerpt
from support.triton_wheel import triton_wheel_stand_in

from flare_l2evict import L2EvictError
from flare_l2evict._judged import Judged
from flare_l2evict._triton import table as triton_table

ROOT = Path(__file__).resolve().parents[1]
RECORDED_REGISTRY = (
    # `pip index versions --pre triton` on 2026-12-07.
    "3.9.0, 3.8.0, 3.7.1, 3.7.0, 3.6.0, 3.5.1, 3.5.0, 3.4.0, 3.3.1, 3.3.0, 3.2.0, 3.1.0, 3.0.0, "
    "2.3.1, 2.3.0, 2.2.0, 2.1.0, 2.0.0"
)
SUPPORT = Path(__file__).parent / "support"
# 3.6's testing.py binds `runtime` at its line 10; the excerpt starts at its line 26.
TESTING_3_6 = "from . import runtime\n" + excerpt("testing.py")
NVIDIA_3_6 = excerpt("nvidia_driver.py")
RUNTIME_3_6 = excerpt("runtime_driver.py")
RUNTIME_3_4 = (SUPPORT / "triton_3_4" / "runtime_driver.py.txt").read_text(encoding="utf-8")

judge = script("triton_releases")
releases = judge.RELEASES


def recorded_registry_stand_in(name: str) -> list[str]:
    """Stands in for the package registry: the version list it gave on 2026-12-07."""
    assert name == "triton"
    return RECORDED_REGISTRY.split(", ")


def test_the_docs_table_is_the_rendered_release_table() -> None:
    page = (ROOT / "docs" / "triton.md").read_text()
    assert releases.readme_table(page) == releases.render_readme(releases.read_table())


def test_every_recorded_registry_release_from_3_0_has_a_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert releases.main(["--discover"], list_versions=recorded_registry_stand_in) == 0
    assert "every release on the registry has a row (13 rows)" in capsys.readouterr().out
    assert min(releases.read_table(), key=releases.key) == "triton==3.0.0"


@pytest.mark.parametrize("removed", ["triton==3.0.0", "triton==3.9.0"])
def test_removing_a_row_makes_discovery_fail_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], removed: str
) -> None:
    assert discovery_without(releases, removed, tmp_path, recorded_registry_stand_in) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{removed}: no judged row; judge it and write its row with: "
        f"python scripts/triton_releases.py --judge {removed} --write",
        "release discovery: 1 releases unjudged",
    ]


def test_a_new_release_needs_a_row_and_one_before_3_0_never_does() -> None:
    def newer_registry_stand_in(name: str) -> list[str]:
        return [*recorded_registry_stand_in(name), "3.10.0rc1", "2.3.2"]

    assert releases.unjudged(releases.read_table(), newer_registry_stand_in) == [
        "triton==3.10.0rc1"
    ]
    assert releases.unjudged({}, recorded_registry_stand_in)[0] == "triton==3.0.0"


# The judge: the seam proof on one release's three files.


def test_triton_3_6_installs() -> None:
    got = judge.judge_sources("3.6.0", TESTING_3_6, NVIDIA_3_6, RUNTIME_3_6)
    assert got == {
        "installs": True,
        "reason": "triton 3.6.0: do_bench flush through "
        "triton.backends.nvidia.driver.CudaDriver's two methods, looked up at call time",
    }


def test_a_driver_config_handing_out_a_lazy_proxy_stays_stock_naming_it() -> None:
    """3.6's timing code and driver class with 3.4's DriverConfig (the whole file)."""
    got = judge.judge_sources("3.4.0", TESTING_3_6, NVIDIA_3_6, RUNTIME_3_4)
    assert got["installs"] is False
    assert str(got["reason"]).startswith(
        "the active Triton driver is triton.runtime.driver.LazyProxy, a proxy in front of the "
        "driver, not triton.backends.nvidia.driver.CudaDriver itself"
    )


def test_a_do_bench_zeroing_its_own_buffer_stays_stock_as_3_2_does() -> None:
    testing = TESTING_3_6.replace("runtime.driver.active.clear_cache(cache)", "cache.zero_()")
    got = judge.judge_sources("3.2.0", testing, NVIDIA_3_6, RUNTIME_3_6)
    assert got["installs"] is False
    assert str(got["reason"]).startswith(
        "triton.testing.do_bench does not ask runtime.driver.active for clear_cache when it runs"
    )


def test_a_cuda_driver_without_clear_cache_stays_stock() -> None:
    nvidia = NVIDIA_3_6.replace("def clear_cache(self, cache):", "def zero_cache(self, cache):")
    got = judge.judge_sources("9.9.0", TESTING_3_6, nvidia, RUNTIME_3_6)
    assert got == {
        "installs": False,
        "reason": "the active Triton driver triton.backends.nvidia.driver.CudaDriver has no "
        "clear_cache: this Triton flushes another way; Triton's flush stays stock",
    }
    no_class = judge.judge_sources("9.9.0", TESTING_3_6, "class HipDriver: pass\n", RUNTIME_3_6)
    assert no_class["reason"] == (
        "triton 9.9.0 has no triton.backends.nvidia.driver.CudaDriver; Triton's flush stays stock"
    )


def test_a_do_bench_reading_a_runtime_it_did_not_import_from_triton_stays_stock() -> None:
    testing = TESTING_3_6.replace("from . import runtime", "from elsewhere import runtime")
    got = judge.judge_sources("9.9.0", testing, NVIDIA_3_6, RUNTIME_3_6)
    assert got["installs"] is False
    assert "reads runtime.driver.active from an object other than triton.runtime.driver" in str(
        got["reason"]
    )


@pytest.mark.parametrize("which", ["testing", "nvidia", "runtime"])
def test_a_file_this_python_cannot_read_is_no_verdict(which: str) -> None:
    files = {"testing": TESTING_3_6, "nvidia": NVIDIA_3_6, "runtime": RUNTIME_3_6}
    got = judge.judge_sources("9.9.0", **(files | {which: "def broken(:\n"}))
    assert got["error"] is True and "the judge could not run it (SyntaxError" in str(got["reason"])


def cached_sources(cache: Path, version: str, runtime: str = RUNTIME_3_6) -> Path:
    """A download cache holding ``triton==version``'s three files (3.6's, vendored)."""
    folder = cache / f"triton-{version}"
    for name, text in (
        (judge.TESTING, TESTING_3_6),
        (judge.NVIDIA, NVIDIA_3_6),
        (judge.RUNTIME, runtime),
    ):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return cache


def test_judging_a_release_from_the_cache_writes_its_row_and_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = cached_sources(tmp_path / "cache", "3.10.0rc1", RUNTIME_3_4)
    table, page = tmp_path / "table.json", tmp_path / "triton.md"
    table.write_text(json.dumps(releases.read_table()))
    page.write_text((ROOT / "docs" / "triton.md").read_text())
    common = ["--table", str(table), "--readme-path", str(page), "--cache", str(cache)]
    assert releases.main(["--judge", "triton==3.10.0rc1", "--write", *common]) == 0
    err = capsys.readouterr().err
    assert f"sources of triton==3.10.0rc1: in the cache ({cache / 'triton-3.10.0rc1'})" in err
    written = releases.read_table(table)
    assert list(written)[-1] == "triton==3.10.0rc1"  # in version order: the newest last
    assert written["triton==3.10.0rc1"]["installs"] is False
    assert releases.readme_table(page.read_text()) == releases.render_readme(written)
    assert "| `triton` 3.10.0rc1 | stays stock | the active Triton driver is " in page.read_text()
    check = ["--check", "--judge", "triton==3.10.0rc1", *common]
    assert releases.main(check) == 0
    assert "1 releases judged as recorded" in capsys.readouterr().out
    table.write_text(table.read_text().replace('"installs": false', '"installs": true'))
    assert releases.main(check) == 1  # a flipped row is caught
    assert "verdicts differ or failed for triton==3.10.0rc1" in capsys.readouterr().err


def test_help_says_what_it_downloads_and_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        releases.main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "its three source files the proof reads are kept there" in said
    assert "the wheel is deleted" in said and "--discover asks the registry" in said
    assert f"by default the cache is {releases.cache}" in said


# The runtime's lookup.


def test_the_shipped_table_answers_by_version() -> None:
    assert triton_table.judged("3.6.0") == Judged(
        True,
        "triton 3.6.0: do_bench flush through triton.backends.nvidia.driver.CudaDriver's two "
        "methods, looked up at call time",
    )
    got = triton_table.judged("3.4.0")
    assert got is not None and not got.installs and "LazyProxy" in got.reason
    assert triton_table.judged("3.6.0+git1234abcd") is None  # a source build: judged where it runs
    assert triton_table.TABLE == releases.table


def test_a_truncated_shipped_table_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truncated = tmp_path / "triton_releases.json"
    truncated.write_bytes(triton_table.TABLE.read_bytes()[:100])
    monkeypatch.setattr(triton_table, "TABLE", truncated)
    with pytest.raises(L2EvictError) as raised:
        triton_table.judged("3.6.0")
    (line,) = str(raised.value).splitlines()
    assert "is unreadable (JSONDecodeError" in line and line.endswith(
        "fix: reinstall flare-l2evict"
    )


@pytest.mark.parametrize(
    ("release", "said"),
    [
        ("triton==3.x", "'3.x' is not a version (PEP 440); fix: write the release's version as"),
        (
            "torch==2.4",
            "not NAME==VERSION with NAME one of triton; fix: write it as, e.g., triton==",
        ),
    ],
)
def test_a_judge_argument_that_does_not_parse_is_one_line_before_any_download(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], release: str, said: str
) -> None:
    cache = tmp_path / "cache"
    assert releases.main(["--judge", release, "--cache", str(cache)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: scripts/triton_releases.py: ") and said in line
    assert not cache.exists()


@pytest.mark.slow  # pip download, offline, from a local folder
def test_judging_downloads_the_wheel_keeps_its_three_files_and_deletes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pip itself, with no index and a folder holding one wheel stand-in (3.6's files)."""
    files = {judge.TESTING: TESTING_3_6, judge.NVIDIA: NVIDIA_3_6, judge.RUNTIME: RUNTIME_3_6}
    wheels = triton_wheel_stand_in(tmp_path / "index", "3.10.0", files).parent
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    cache = tmp_path / "cache"
    table = tmp_path / "table.json"
    table.write_text(json.dumps(releases.read_table()))
    argv = ["--judge", "triton==3.10.0", "--cache", str(cache), "--table", str(table)]
    assert releases.main(argv) == 0
    out, err = capsys.readouterr()
    assert "triton==3.10.0                   installs: triton 3.10.0: do_bench flush" in out
    assert "downloaded triton-3.10.0-cp312-cp312-manylinux_2_28_x86_64.whl: 1.1 MB" in err
    kept = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file())
    assert kept == sorted(f"triton-3.10.0/{name}" for name in files)  # no wheel, no .so
    assert releases.main(argv) == 0  # judged again from the cache: no download
    assert "sources of triton==3.10.0: in the cache" in capsys.readouterr().err
