"""A section named near ``[plugins.l2evict]`` is never silent (issue 41); a sibling's is no typo
(issue 46).

Case -> outcome:

- no ``[plugins.l2evict]``, but a section whose name is near it (another case, a letter
  missing, extra or changed, ``plugin`` for ``plugins``, ``-`` or ``_`` inside, the name at the
  top level, a look-alike or a no-break space), holding ``enabled = false`` -> the hook keeps
  stock b12x, credits 0, and logs one line naming the near miss and the fix;
- other sections (another plugin's, the server's own) -> no refusal: the hook credits;
- a sibling plugin's section, a name whose numbers differ (``l2evict2``, ``l1evict``, a
  top-level ``l3evict``) -> no refusal: the hook credits;
- a name printed in the refusal -> every character past ASCII escaped (``\\u0456``);
- a sibling refused as a near miss, beside an empty ``[plugins.l2evict]`` -> the hook credits;
- a host's config whose top level or ``plugins`` never ends, and whose ``len`` lies -> read no
  further than :data:`MAX_SCANNED_KEYS` keys each;
- :func:`locate_section` -> the section's bounded keys, and whether it was found.

The host's config mappings are stand-ins (named so); pluggy, the plugin, b12x's seam and the
reference runtime are real.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from support.hosts import CREDIT, complete, hook, runtime, seam_is_ours
from support.startups import installed

from flare_l2evict._errors import ConfigError
from flare_l2evict._settings import MAX_SCANNED_KEYS, MAX_SECTION_KEYS, Section, locate_section

pytest.importorskip("b12x.preparation._measurement")

OFF = {"enabled": False}
NEAR_MISSES: dict[str, tuple[dict[str, Any], str]] = {
    "another-case": ({"plugins": {"L2evict": OFF}}, "[plugins.L2evict]"),
    "plugins-in-another-case": ({"Plugins": {"l2evict": OFF}}, "[Plugins.l2evict]"),
    "a-letter-missing": ({"plugins": {"l2evic": OFF}}, "[plugins.l2evic]"),
    "a-letter-extra": ({"plugins": {"l2evictt": OFF}}, "[plugins.l2evictt]"),
    "a-letter-changed": ({"plugins": {"l2evixt": OFF}}, "[plugins.l2evixt]"),
    "a-digit-typed-as-a-letter": ({"plugins": {"lwevict": OFF}}, "[plugins.lwevict]"),
    # Printed with every character past ASCII escaped: "rename X to ..." must not read as a no-op.
    "a-cyrillic-i": ({"plugins": {"l2ev\u0456ct": OFF}}, '[plugins."l2ev\\u0456ct"]'),
    "a-no-break-space": ({"plugins": {"l2evict\xa0": OFF}}, '[plugins."l2evict\\u00a0"]'),
    "a-full-width-digit": ({"plugins": {"l\uff12evict": OFF}}, '[plugins."l\\uff12evict"]'),
    "two-letters-swapped": ({"plugins": {"l2evcit": OFF}}, "[plugins.l2evcit]"),
    "plugin-for-plugins": ({"plugin": {"l2evict": OFF}}, "[plugin.l2evict]"),
    "a-dash-inside": ({"plugins": {"l2-evict": OFF}}, "[plugins.l2-evict]"),
    "an-underscore-inside": ({"plugins": {"l2_evict": OFF}}, "[plugins.l2_evict]"),
    "both-names-near": ({"Plugin": {"L2-Evict": OFF}}, "[Plugin.L2-Evict]"),
    "at-the-top-level": ({"l2evict": OFF}, "[l2evict]"),
    "at-the-top-level-in-another-case": ({"L2evict": OFF}, "[L2evict]"),
    "a-dotted-key-at-the-top-level": ({"plugins.l2evict": OFF}, '["plugins.l2evict"]'),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_a_near_miss_of_the_sections_name_keeps_stock_and_names_it(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the section was not found, so the plugin ran with its defaults and credited,
    # whatever the operator wrote there (enabled = false too), without a word.
    config, named = NEAR_MISSES[case]
    host = runtime(config=config)
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(host)
    assert report.reclaimed_bytes == 0 and host.kv_allocator.reclaimed_bytes == 0
    reason = report.reason or ""
    assert f"but {named} is near its name" in reason, reason
    assert f"fix: rename {named} to [plugins.l2evict]" in reason, reason
    assert "if that section is another plugin's, add an empty [plugins.l2evict]" in reason
    assert reason.isascii(), reason
    assert installed() is None and not seam_is_ours()
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and named in line.getMessage()
    assert "\n" not in line.getMessage()
    complete(host)


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"plugins": {"other": {"enabled": False}}},
        {"plugins": {"l2evictor": {}}, "model": {"path": "x"}},
        {"plugins": None, "server": {"port": 8000}},
        {"l2": {}, "evict": {}, "plugins_extra": {"l2evict": {}}},
        {3: {}, b"l2evict": {}, "l2evict" * 20: {}},  # no str, or far longer than the name
        # Siblings: a name whose numbers differ is another plugin's, not a typo of ours.
        {"plugins": {"l2evict2": OFF}},
        {"plugins": {"l1evict": OFF}},
        {"l3evict": OFF},
        {"plugins": {"L3-Evict": OFF, "l2evict10": OFF}},
    ],
    ids=[
        "empty",
        "another-plugin",
        "a-longer-name",
        "plugins-none",
        "far-names",
        "not-names",
        "sibling-l2evict2",
        "sibling-l1evict",
        "sibling-l3evict-at-the-top-level",
        "siblings-in-another-case",
    ],
)
def test_sections_that_are_not_near_misses_are_left_alone(config: dict[Any, Any]) -> None:
    # Before (siblings): every start-up fell back, telling the operator to rename the other
    # plugin's section to ours.
    host = runtime(config=config)
    assert hook(host).reclaimed_bytes == CREDIT
    complete(host)


def test_a_sibling_refused_as_a_near_miss_is_let_through_by_an_empty_section() -> None:
    # The way out the refusal names, for a sibling whose name differs from ours by a letter.
    sibling = {"l2evicts": {"enabled": True}}
    with pytest.raises(ConfigError, match=r"add an empty \[plugins\.l2evict\]"):
        locate_section({"plugins": sibling})
    host = runtime(config={"plugins": {**sibling, "l2evict": {}}})
    assert hook(host).reclaimed_bytes == CREDIT
    complete(host)


class EndlessTableStandIn(Mapping[str, Any]):
    """A host's table whose keys never end and whose ``len`` lies; counts the keys read."""

    def __init__(self, plugins: Mapping[str, Any] | None = None) -> None:
        self.plugins = plugins
        self.read = 0

    def __iter__(self) -> Iterator[str]:
        for number in itertools.count():
            self.read += 1
            yield "plugins" if number == 0 and self.plugins is not None else f"key{number}"

    def __len__(self) -> int:
        return 2  # a lie

    def __getitem__(self, key: str) -> Any:
        if key == "plugins" and self.plugins is not None:
            return self.plugins
        raise KeyError(key)


@pytest.mark.parametrize("which", ["top-level", "plugins", "both"])
def test_a_config_that_never_ends_is_read_no_further_than_the_bound(which: str) -> None:
    inner = EndlessTableStandIn()
    config: Mapping[str, Any] = {
        "top-level": EndlessTableStandIn(),
        "plugins": {"plugins": inner},
        "both": EndlessTableStandIn(inner),
    }[which]
    host = runtime()
    host.config = config
    assert hook(host).reclaimed_bytes == CREDIT  # no near miss: the defaults, as before
    complete(host)
    tables = [t for t in (config, inner) if isinstance(t, EndlessTableStandIn) and t.read]
    assert tables and all(t.read <= MAX_SCANNED_KEYS for t in tables), [t.read for t in tables]


def test_locate_section_gives_its_keys_and_whether_it_was_found() -> None:
    assert locate_section(None) == Section({}, found=False)
    assert locate_section({"plugins": {"other": {}}}) == Section({}, found=False)
    assert locate_section({"plugins": {"l2evict": None}}) == Section({}, found=True)
    found = locate_section({"plugins": {"l2evict": {"window": "256MiB"}}})
    assert found == Section({"window": "256MiB"}, found=True)
    with pytest.raises(ConfigError, match=r"near its name"):
        locate_section({"plugins": {"L2evict": {}}})
    with pytest.raises(ConfigError, match=f"more than {MAX_SECTION_KEYS} keys"):
        locate_section({"plugins": {"l2evict": {f"k{i}": 1 for i in range(MAX_SECTION_KEYS + 1)}}})


# --- the command line: check, plan and startup say what they found -----------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[plugins.l2evic]\nenabled = false\n", "[plugins.l2evic]"),
        ("[plugin.l2evict]\nenabled = false\n", "[plugin.l2evict]"),
        ('{"plugins": {"L2evict": {"enabled": false}}}', "[plugins.L2evict]"),
    ],
)
@pytest.mark.parametrize("command", ["check", "plan", "startup"])
def test_a_near_miss_in_a_config_file_stops_every_command_in_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], command: str, text: str, named: str
) -> None:
    from flare_l2evict.tools import main

    config = tmp_path / ("deploy.json" if text.startswith("{") else "deploy.toml")
    config.write_text(text)
    argv = [command, "--config", str(config), *(["x.safetensors"] if command == "plan" else [])]
    code = main([*argv, "--plugin", "l2evict"] if command == "startup" else argv)
    out, err = capsys.readouterr()
    (line,) = err.splitlines()  # refused before any step: stock b12x untouched, nothing credited
    assert code == 2 and out == ""
    assert line.startswith(f"error: flare-l2evict {command}: no [plugins.l2evict] section, but ")
    assert (
        f"{named} is near its name" in line and f"fix: rename {named} to [plugins.l2evict]" in line
    )


@pytest.mark.parametrize(
    ("text", "said", "figures"),
    [
        (
            '[plugins.l2evict]\nwindow = "stock"\nenabled = true\n',
            "config: [plugins.l2evict] found in {}, 2 keys",
            {"found": True, "keys": 2},
        ),
        (
            "[server]\nport = 1\n",
            "config: no [plugins.l2evict] in {}: defaults apply",
            {"found": False, "keys": 0},
        ),
        (None, "config: none given: defaults apply", {"file": None, "found": False, "keys": 0}),
    ],
)
def test_check_says_whether_it_found_the_section(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], text: str | None, said: str, figures: Any
) -> None:
    from support.json_output import parsed

    from flare_l2evict.tools import main

    config = tmp_path / "deploy.toml"
    given = [] if text is None else ["--config", str(config)]
    if text is not None:
        config.write_text(text)
    assert main(["check", "--device", "cpu", *given]) == 0
    lines = capsys.readouterr().out.splitlines()
    rest = itertools.takewhile(lambda line: line.startswith("    "), lines[2:])
    assert " ".join([lines[1], *(line.strip() for line in rest)]) == said.format(config)
    main(["check", "--device", "cpu", "--json", *given])
    found = parsed("check", capsys.readouterr().out)["config"]
    assert found.items() >= figures.items()
    assert found["file"] == (None if text is None else str(config))
