"""The ``plugins.l2evict`` section and the deployment config files that hold it.

Case -> outcome (among the others):

- a JSON or YAML config with a key twice -> refused, never last-one-wins;
- ``window`` = "1" + 150,000 spaces + "x", 20 KB values -> one line, at once;
- 9 exclude globs, a 1,001-character glob -> one line naming the limit;
- a FIFO config -> "not a regular file", never blocks; a 3 GB sparse config ->
  refused by size, never read; /dev/zero or a checkpoint as config -> its own
  line, not "missing", never decoded;
- a directory as config -> its own line, naming the config files it holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support.figures import MiB
from support.python_child import run_python

from flare_l2evict import ConfigError, L2EvictSettings, load_deployment_config
from flare_l2evict._settings import MAX_EXCLUDE_PATTERNS
from flare_l2evict._text import shown
from flare_l2evict.tools._inputs import settings_from_config as settings


def section(**keys: object) -> dict[str, object]:
    return {"plugins": {"l2evict": keys}}


def test_defaults_when_the_section_is_absent() -> None:
    assert settings({}) == L2EvictSettings()
    assert settings({"plugins": {"other": {"x": 1}}}).enabled is True
    assert settings(None).window == "stock"
    assert settings({}).on_error == "fallback"


def test_switch_off_without_uninstalling() -> None:
    assert settings(section(enabled=False)).enabled is False


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (1 << 20, 1 << 20),
        ("256MiB", 256 << 20),
        ("1 GiB", 1 << 30),
        ("4194304", 4 << 20),
        ("stock", "stock"),
        # Binary, as torch and nvidia-smi count (the README says so): 256MB is 256 MiB.
        ("256MB", 256 << 20),
        ("2gb", 2 << 30),
    ],
)
def test_window_forms(given: object, expected: object) -> None:
    assert settings(section(window=given)).window == expected


def test_unknown_key_names_the_key_and_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        settings(section(windw=5))
    message = str(caught.value)
    assert "plugins.l2evict.windw: unknown key" in message
    assert "enabled, window, exclude, on_error, triton" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "bad",
    [
        -5,
        0,
        1,
        4096,
        (1 << 20) + 2,
        "65GiB",
        1.5,
        "lots",
        True,
        None,
        "\uff12\uff15\uff16MiB",
        "\u0662\u0665\u0666MiB",
        "1e9",
        "0x100",
    ],
)
def test_bad_window_is_rejected_with_the_allowed_values(bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        settings(section(window=bad))
    message = str(caught.value)
    assert message.startswith("plugins.l2evict.window = ")
    assert "whole number of bytes divisible by 4 between 1 MiB and 64 GiB" in message


@pytest.mark.parametrize(
    ("key", "value", "hint"),
    [
        ("enabled", "yes", "true or false"),
        ("on_error", "ignore", "'fallback'"),
        ("exclude", "*.embed*", "list of tensor-name glob patterns"),
        ("exclude", [""], "list of tensor-name glob patterns"),
    ],
)
def test_bad_values_name_key_and_allowed(key: str, value: object, hint: str) -> None:
    with pytest.raises(ConfigError, match=rf"plugins\.l2evict\.{key} = .*{hint}"):
        settings(section(**{key: value}))


def test_section_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match="must be a table"):
        settings({"plugins": {"l2evict": "on"}})


def test_toml_yaml_json_give_the_same_settings(tmp_path: Path) -> None:
    (tmp_path / "d.toml").write_text(
        '[plugins.l2evict]\nwindow = "128MiB"\nexclude = ["*.embed_tokens.*"]\n'
    )
    (tmp_path / "d.yaml").write_text(
        "plugins:\n  l2evict:\n    window: 128MiB\n    exclude: ['*.embed_tokens.*']\n"
    )
    (tmp_path / "d.json").write_text(
        json.dumps({"plugins": {"l2evict": {"window": "128MiB", "exclude": ["*.embed_tokens.*"]}}})
    )
    loaded = [
        settings(load_deployment_config(tmp_path / f"d.{s}")) for s in ("toml", "yaml", "json")
    ]
    assert loaded[0] == loaded[1] == loaded[2]
    assert loaded[0].window == 128 << 20
    assert loaded[0].exclude == ("*.embed_tokens.*",)


def test_yaml_builds_no_objects(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("plugins: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="cannot parse yaml"):
        load_deployment_config(path)


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("bad.toml", "[plugins.l2evict\n", "cannot parse toml"),
        ("bad.json", "{", "cannot parse json"),
        ("bad.ini", "x", "unknown config format"),
        ("list.json", "[1, 2]", "top level must be a table"),
    ],
)
def test_unreadable_configs(tmp_path: Path, name: str, text: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_deployment_config(path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_deployment_config(tmp_path / "absent.toml")


def test_a_directory_as_config_is_told_the_config_files_it_holds(tmp_path: Path) -> None:
    # Issue 46: it was told "pass --config FILE", whatever the directory held.
    where = shown(str(tmp_path))  # as every path is echoed (cut past 200 characters)
    with pytest.raises(ConfigError) as caught:
        load_deployment_config(tmp_path)
    assert str(caught.value) == (
        f"{where}: is a directory, not a config file; fix: pass the path of a config file "
        "(.toml, .yaml, .yml or .json), not of a directory"
    )
    for name in ("deploy.json", "deploy.toml", "model.safetensors.index.json", "notes.txt"):
        (tmp_path / name).write_text("{}")
    with pytest.raises(ConfigError) as caught:
        load_deployment_config(tmp_path)
    assert str(caught.value) == (
        f"{where}: is a directory, not a config file; fix: pass the config file itself, as in "
        f"--config {shown(str(tmp_path / 'deploy.toml'))} (it holds deploy.toml, deploy.json)"
    )


# Issue 28, "wrong words": a byte-order mark and a permission error are named as what they are.
BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".toml", '[plugins.l2evict]\nwindow = "256MiB"\n'),
        (".json", '{"plugins": {"l2evict": {"window": "256MiB"}}}'),
        (".yaml", "plugins:\n  l2evict:\n    window: 256MiB\n"),
    ],
)
def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path, suffix: str, text: str) -> None:
    # Windows editors save UTF-8 with a BOM; tomllib and json refused it "at line 1, column 1".
    plain, marked = tmp_path / f"plain{suffix}", tmp_path / f"marked{suffix}"
    plain.write_bytes(text.encode())
    marked.write_bytes(BOM + text.encode())
    assert load_deployment_config(marked) == load_deployment_config(plain)
    assert settings(load_deployment_config(marked)).window == 256 << 20


def test_a_utf16_config_is_named_as_utf16(tmp_path: Path) -> None:
    path = tmp_path / "deploy.toml"
    path.write_bytes('[plugins.l2evict]\nwindow = "256MiB"\n'.encode("utf-16"))
    with pytest.raises(
        ConfigError, match=r"UTF-16 .*byte-order mark\); fix: save the config as UTF-8"
    ):
        load_deployment_config(path)


@pytest.mark.parametrize(
    "encoded",
    [
        lambda text: text.encode("utf-32"),  # little-endian, its mark first
        lambda text: b"\x00\x00\xfe\xff" + text.encode("utf-32-be"),
    ],
    ids=["le", "be"],
)
def test_a_utf32_config_is_named_as_utf32(tmp_path: Path, encoded: Callable[[str], bytes]) -> None:
    path = tmp_path / "deploy.toml"
    path.write_bytes(encoded('[plugins.l2evict]\nwindow = "256MiB"\n'))
    with pytest.raises(
        ConfigError, match=r": UTF-32 text \(it starts with a UTF-32 byte-order mark\); fix: save"
    ):
        load_deployment_config(path)


_AS_NOBODY = """
import os, sys
from flare_l2evict import ConfigError, load_deployment_config
from flare_l2evict.tools.cli._shared import error_line
os.setegid(65534)
os.seteuid(65534)  # root reads any file: drop to nobody (real ids stay root) for the open
try:
    load_deployment_config(sys.argv[1])
except ConfigError as error:
    print(error_line("flare-l2evict check", str(error)))
"""


@pytest.mark.slow  # a fresh interpreter, as another user where the run is root's
def test_an_unreadable_config_is_named_a_permission_error(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="flare-l2evict-"))  # under /tmp, not root's 0700 tree
    try:
        folder.chmod(0o755)
        path = folder / "deploy.toml"
        path.write_text("[plugins.l2evict]\nenabled = true\n")
        path.chmod(0o000)
        if os.geteuid() == 0:
            ran = subprocess.run(
                [sys.executable, "-c", _AS_NOBODY, str(path)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert ran.returncode == 0, ran.stderr
            line = ran.stdout.strip()
        else:
            from flare_l2evict.tools.cli._shared import error_line

            with pytest.raises(ConfigError) as raised:
                load_deployment_config(path)
            line = error_line("flare-l2evict check", str(raised.value))
    finally:
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()
    assert line.count("\n") == 0 and "permission denied" in line, line
    assert "fix: make it readable by the user the server runs as" in line, line
    assert "line or key named" not in line, line


def test_a_glob_with_too_many_stars_is_refused_naming_the_limit() -> None:
    # Each '*' lets a match retry every position: 8 globs of 16 '*' took 35 s on 250,000 names.
    from flare_l2evict._settings import MAX_PATTERN_STARS

    assert settings(section(exclude=["*" + ".*" * (MAX_PATTERN_STARS - 1)])).exclude
    with pytest.raises(
        ConfigError, match=f"at most 1,000 characters and {MAX_PATTERN_STARS} '\\*'"
    ):
        settings(section(exclude=["*x" * MAX_PATTERN_STARS + "*"]))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("twice.json", '{"plugins": {"l2evict": {"on_error": "raise", "on_error": "fallback"}}}'),
        ("twice.yaml", "plugins:\n  l2evict:\n    on_error: raise\n    on_error: fallback\n"),
    ],
)
def test_a_key_given_twice_is_refused_not_last_one_wins(
    tmp_path: Path, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_deployment_config(path)
    message = str(caught.value)
    assert 'key "on_error" appears twice in one mapping' in message and "; fix: " in message


# Bounded in time and bytes: no value or file hangs the parser or is read whole.
@pytest.mark.slow  # a fresh interpreter (a hang fails by its timeout)
def test_a_window_of_spaces_answers_at_once() -> None:
    """Was over 60 s: the size pattern backtracked quadratically. A 10 s guard, not a speed test."""
    out = run_python(
        "from flare_l2evict.tools._inputs import settings_from_config\n"
        "from flare_l2evict._errors import ConfigError\n"
        "for value in ['1' + ' ' * 150_000 + 'x', '1' + ' ' * 20_000 + 'k' * 5, '9' * 20_000,"
        " ' ' * 20_000 + '1', '1' * 20_000 + 'x']:\n"
        "    try:\n"
        "        settings_from_config({'plugins': {'l2evict': {'window': value}}})\n"
        "    except ConfigError as error:\n"
        "        assert len(str(error)) < 1024 and '\\n' not in str(error)\n"
        "        print('refused')\n",
        timeout=10,
    )
    assert out.split() == ["refused"] * 5


@pytest.mark.parametrize(
    ("value", "nbytes"),
    [("256MiB", 256 * MiB), (" 256 mib ", 256 * MiB), ("1048576", MiB), ("64GiB", 64 << 30)],
)
def test_sizes_still_parse(value: str, nbytes: int) -> None:
    assert settings({"plugins": {"l2evict": {"window": value}}}).window == nbytes


@pytest.mark.parametrize(
    ("exclude", "problem"),
    [
        (
            [f"layer{i}.*" for i in range(MAX_EXCLUDE_PATTERNS + 1)],
            f"at most {MAX_EXCLUDE_PATTERNS}",
        ),
        (["*" * 1001], "at most 1,000"),
    ],
)
def test_exclude_is_bounded(exclude: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        settings({"plugins": {"l2evict": {"exclude": exclude}}})


class LyingGlobStandIn(str):
    """A glob whose ``len`` and ``count`` under-report (a host's str subclass)."""

    def __len__(self) -> int:
        return 1

    def count(self, *args: object) -> int:
        return 0


def test_a_str_subclass_cannot_lie_its_way_past_the_exclude_limits() -> None:
    with pytest.raises(ConfigError, match="at most 1,000 characters"):
        settings({"plugins": {"l2evict": {"exclude": [LyingGlobStandIn("*x" * 3000)]}}})
    kept = settings({"plugins": {"l2evict": {"exclude": [LyingGlobStandIn("a.*")]}}}).exclude
    assert kept == ("a.*",) and type(kept[0]) is str


def test_a_fifo_config_is_not_a_regular_file_and_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "deploy.toml"
    os.mkfifo(fifo)
    out = run_python(
        "from flare_l2evict.tools._config_file import load_deployment_config\n"
        "from flare_l2evict._errors import ConfigError\n"
        "try:\n"
        f"    load_deployment_config({str(fifo)!r})\n"
        "except ConfigError as error:\n"
        "    print(error)\n",
        timeout=20,
    )
    assert "not a regular file" in out and "no such" not in out


def test_a_3_gb_config_is_refused_by_its_size_unread(tmp_path: Path) -> None:
    huge = tmp_path / "deploy.toml"
    with huge.open("wb") as handle:
        handle.truncate(3 << 30)  # sparse: nothing is written, and nothing may be read
    with pytest.raises(ConfigError, match=r"3,221,225,472 bytes, over the 1,048,576"):
        load_deployment_config(huge)


def test_dev_zero_as_config_is_not_a_regular_file() -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load_deployment_config("/dev/zero")


def test_a_checkpoint_passed_as_config_is_refused_before_decoding(tmp_path: Path) -> None:
    wrong = tmp_path / "model.safetensors"
    wrong.write_bytes(b"\0" * 2 * MiB)
    with pytest.raises(ConfigError, match="2,097,152 bytes, over"):
        load_deployment_config(wrong)


@pytest.mark.parametrize("path", [3, None, b"deploy.json"], ids=["int", "none", "bytes"])
def test_a_config_path_that_is_no_path_is_one_line(path: object) -> None:
    with pytest.raises(ConfigError, match="not text or a path; fix: pass the deployment config"):
        load_deployment_config(path)  # type: ignore[arg-type]


# A host's section may be any Mapping: its keys are read only up to the cap, never counted
# with len() (which may lie) and never all iterated (which may never end).
_HOSTILE_SECTIONS = """
from collections.abc import Mapping
from itertools import count
from flare_l2evict._errors import ConfigError
from flare_l2evict.tools._inputs import settings_from_config

class EndlessSectionStandIn(Mapping):
    def __iter__(self):
        return (f"key{i}" for i in count())
    def __len__(self):
        return 2  # a lie
    def __getitem__(self, key):
        return 1

class EndlessListStandIn(list):
    def __iter__(self):
        return (f"layer{i}.*" for i in count())
    def __len__(self):
        return 1  # a lie

for config in (
    {"plugins": {"l2evict": EndlessSectionStandIn()}},
    {"plugins": {"l2evict": {f"key{i}": 1 for i in range(1_000_000)}}},
    {"plugins": {"l2evict": {"exclude": EndlessListStandIn(["a.*"] * 20)}}},
):
    try:
        settings_from_config(config)
        print("accepted")
    except ConfigError as error:
        print(error)
"""


@pytest.mark.slow  # a fresh interpreter (a hang fails by its timeout)
def test_a_section_of_endless_or_a_million_keys_is_refused_naming_the_cap() -> None:
    from flare_l2evict._settings import MAX_SECTION_KEYS

    endless, million, endless_list = run_python(_HOSTILE_SECTIONS, timeout=60).splitlines()
    for line in (endless, million):
        assert line.startswith(f"[plugins.l2evict] holds more than {MAX_SECTION_KEYS} keys"), line
        assert "enabled, window, exclude, on_error, triton" in line and "; fix: " in line, line
    assert f"at most {MAX_EXCLUDE_PATTERNS}" in endless_list, endless_list


@pytest.mark.slow  # a fresh interpreter (a hang fails by its timeout)
def test_mappings_on_the_path_to_the_section_are_read_in_bounded_time() -> None:
    # Asked for one key each; a missing section has a bounded prefix of their keys read for
    # a near miss of its name (test_config_near_miss.py), never all of them.
    out = run_python(
        _HOSTILE_SECTIONS.split("for config in")[0]
        + "class EndlessPluginsStandIn(EndlessSectionStandIn):\n"
        "    def __getitem__(self, key):\n"
        "        if key != 'l2evict':\n"
        "            raise KeyError(key)\n"
        "        return {'window': '256MiB'}\n"
        "print(settings_from_config({'plugins': EndlessPluginsStandIn()}).window)\n"
        "print(settings_from_config(EndlessPluginsStandIn()).window)\n",
        timeout=60,
    )
    assert out.split() == [str(256 * MiB), "stock"], out
