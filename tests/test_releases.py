"""The release table: rendered into docs/b12x.md, and every registry release has a row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fake_b12x import wheel_without_b12x
from support.scripts import discovery_without, script

ROOT = Path(__file__).resolve().parents[1]


releases = script("b12x_releases")

RECORDED_REGISTRY = {
    # `pip index versions --pre NAME` on 2026-12-01, older releases cut.
    "b12x": "1.5.1, 1.5.0, 1.3.0, 1.2.8, 1.2.6, 1.2.5, 1.2.4, 1.2.3, 1.2.2, 1.2.1, 1.2.0, 1.1.0, "
    "0.30.2",
    "flashinfer-python": "0.7.4, 0.7.2.post1, 0.7.2, 0.7.2rc6, 0.7.2rc5, 0.7.2rc3, 0.7.1, "
    "0.7.1rc5, 0.7.1rc4, 0.7.1rc2, 0.7.1rc1, 0.7.0.post1, 0.7.0, 0.7.0rc4, 0.7.0rc3, 0.6.18",
}


def recorded_registry_stand_in(name: str) -> list[str]:
    """Stands in for the package registry: the version lists it gave on 2026-12-01."""
    return RECORDED_REGISTRY[name].split(", ")


def test_the_readme_table_is_the_rendered_release_table() -> None:
    readme = (ROOT / "docs" / "b12x.md").read_text()
    assert releases.readme_table(readme) == releases.render_readme(releases.read_table())


def test_every_recorded_registry_release_has_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert releases.main(["--discover"], list_versions=recorded_registry_stand_in) == 0
    assert "every release on the registry has a row" in capsys.readouterr().out


@pytest.mark.parametrize("removed", ["flashinfer-python==0.7.2rc6", "b12x==1.5.1"])
def test_removing_a_row_makes_discovery_fail_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], removed: str
) -> None:
    assert discovery_without(releases, removed, tmp_path, recorded_registry_stand_in) == 1
    err = capsys.readouterr().err
    assert (
        f"{removed}: no judged row; judge it and write its row with: "
        f"python scripts/b12x_releases.py --judge {removed} --write"
    ) in err.splitlines()
    assert "1 releases unjudged" in err


def test_discovery_starts_at_each_distributions_oldest_row() -> None:
    """0.7.0rc3/rc4, 0.6.18 and b12x 1.1.0 predate the oldest rows; a new release does not."""
    registry = dict(RECORDED_REGISTRY)
    registry["flashinfer-python"] += ", 0.7.5rc1"

    def newer_registry_stand_in(name: str) -> list[str]:
        return registry[name].split(", ")

    assert releases.unjudged(releases.read_table(), newer_registry_stand_in) == [
        "flashinfer-python==0.7.5rc1"
    ]


def test_a_judged_row_is_written_in_version_order(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    table = {"b12x==1.10.0": {"installs": True}, "b12x==1.5.0": {"installs": True}}
    releases.write_table(table | {"b12x==1.5.1rc1": {"installs": False}}, path)
    assert list(json.loads(path.read_text())) == ["b12x==1.5.0", "b12x==1.5.1rc1", "b12x==1.10.0"]


def test_judging_a_release_writes_its_row_and_the_readme(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wheel stand-in (a flashinfer-python 0.7.9 wheel without b12x) in the download cache."""
    cache = wheel_without_b12x(tmp_path / "wheels").parent
    table, readme = tmp_path / "table.json", tmp_path / "b12x.md"
    table.write_text(json.dumps(releases.read_table()))
    readme.write_text((ROOT / "docs" / "b12x.md").read_text())
    release = "flashinfer-python==0.7.9"
    common = ["--table", str(table), "--readme-path", str(readme)]
    argv = ["--judge", release, "--write", "--cache", str(cache), *common]
    assert releases.main(argv) == 0
    written = releases.read_table(table)
    assert written[release] == {"installs": False, "reason": "ships no b12x package"}
    assert list(written)[-1] == release  # in version order: the newest flashinfer-python last
    assert releases.readme_table(readme.read_text()) == releases.render_readme(written)
    assert "0.7.4, 0.7.9 |" not in readme.read_text()  # 0.7.9 falls back: a row of its own
    assert (
        "| `flashinfer-python` 0.7.9 | falls back | ships no b12x package |" in readme.read_text()
    )
    registry = dict(RECORDED_REGISTRY)
    registry["flashinfer-python"] += ", 0.7.9"
    # With its row written, discovery passes where the registry has 0.7.9.
    assert (
        releases.main(["--discover", *common], list_versions=lambda n: registry[n].split(", ")) == 0
    )
    capsys.readouterr()


@pytest.mark.slow  # pip download, offline
def test_judging_a_release_the_registry_lacks_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pip itself, offline: with no index (PIP_NO_INDEX=1) no release is on the registry."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    table, readme = tmp_path / "table.json", tmp_path / "b12x.md"
    table.write_text(json.dumps(releases.read_table()))
    readme.write_text((ROOT / "docs" / "b12x.md").read_text())
    release = "flashinfer-python==0.0.0.dev999999"
    argv = ["--judge", release, "--write", "--cache", str(tmp_path / "wheels")]
    assert releases.main([*argv, "--table", str(table), "--readme-path", str(readme)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    (line,) = errors
    assert line.startswith(f"error: scripts/b12x_releases.py: pip download {release} failed: ")
    assert "from versions: none" in line and "; fix: " in line, line
    assert releases.read_table(table) == releases.read_table()  # nothing written
