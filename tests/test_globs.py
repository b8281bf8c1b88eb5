"""``exclude``'s globs: fnmatch's meaning, in time linear in the names.

Case -> outcome:

- random globs of ``*``, ``?``, ``[...]``, ``[!...]``, ranges and stray brackets over
  random names, and parts that repeat their first character over names of up to 600
  characters -> the same names as :func:`fnmatch.fnmatchcase`;
- 8 globs of 4 ``*`` at 1,000 characters over 2,000 names of 8,000 characters (the
  hook's 16 MiB of names) -> decided at once (fnmatch's regex retried every position:
  minutes); a 30 s guard, not a speed test (``benchmarks/hook_at_limits.py`` prints
  the time);
- ``?`` or ``[...]`` between two ``*`` -> refused in one line; before the first ``*``
  or after the last -> kept;
- a kept tensor that shares a storage with an excluded one -> counted apart from the
  tensors the globs name.
"""

from __future__ import annotations

import fnmatch
import random

import pytest
from support.python_child import run_python

from flare_l2evict import ConfigError
from flare_l2evict._decision import Storages, choose_regions
from flare_l2evict._globs import matching, wildcard_between_stars
from flare_l2evict.tools._inputs import settings_from_config

_GLOB_CHARACTERS = "ab.*?[]!-"
_NAME_CHARACTERS = "ab.[]!-*?c"


@pytest.mark.parametrize("seed", range(4))
def test_matching_is_fnmatchcase_on_random_globs_and_names(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2500):
        glob = "".join(rng.choices(_GLOB_CHARACTERS, k=rng.randint(0, 12)))
        names = ["".join(rng.choices(_NAME_CHARACTERS, k=rng.randint(0, 14))) for _ in range(24)]
        expected = [i for i, name in enumerate(names) if fnmatch.fnmatchcase(name, glob)]
        assert matching(names, [glob]) == expected, glob


@pytest.mark.parametrize("seed", range(2))
def test_matching_is_fnmatchcase_for_repetitive_parts_in_long_names(seed: int) -> None:
    # Parts that repeat their first character, over names up to 600 characters long: searched
    # a bounded depth into each name and the rest in all the names joined.
    rng = random.Random(seed)
    for _ in range(150):
        parts = ["".join(rng.choices("aaaab", k=rng.randint(0, 12))) for _ in range(4)]
        glob = "*".join(parts)
        names = ["".join(rng.choices("aaaaaab", k=rng.randint(0, 600))) for _ in range(30)]
        expected = [i for i, name in enumerate(names) if fnmatch.fnmatchcase(name, glob)]
        assert matching(names, [glob]) == expected, glob


@pytest.mark.parametrize(
    ("glob", "name", "matches"),
    [
        ("*.embed_tokens.*", "model.embed_tokens.weight", True),
        ("model.layers.[0-3].*", "model.layers.2.mlp.w", True),
        ("model.layers.[!0-3].*", "model.layers.2.mlp.w", False),
        ("*.w?", "model.layers.2.mlp.w1", True),
        ("[*]*", "*x", True),
        ("a[*b]c*", "a*c", True),
        ("*ab*b", "ab", False),  # the tail's b is not the middle's
        ("*aab*", "aaab", True),  # found after a false start
        ("[z-a]*", "z", False),  # an empty range matches nothing
        ("x[", "x[", True),  # a bracket that never closes is literal
        ("*", "", True),
        ("", "", True),
        ("a**b", "ab", True),
    ],
)
def test_matching_edge_cases(glob: str, name: str, matches: bool) -> None:
    assert fnmatch.fnmatchcase(name, glob) is matches  # the reference agrees
    assert matching([name], [glob]) == ([0] if matches else [])


def test_several_globs_match_each_name_once_in_order() -> None:
    names = ["a.x", "b.y", "c.x", "a.y"]
    assert matching(names, ["*.x", "a.*", "*.x"]) == [0, 2, 3]


_AT_THE_LIMITS = """
from flare_l2evict._decision import Storages, choose_regions
from flare_l2evict._settings import MAX_EXCLUDE_PATTERNS, MAX_PATTERN_CHARS, MAX_PATTERN_STARS
from flare_l2evict.tools._inputs import settings_from_config

# Each glob's first middle part matches all but its last character at every position of
# every name: fnmatch's regex compared it about 1,000 times per character.
fill = MAX_PATTERN_CHARS - MAX_PATTERN_STARS - 2
globs = ["*" + "a" * (fill - 1) + c + "*a*a*" for c in "bcdefghi"[:MAX_EXCLUDE_PATTERNS]]
exclude = settings_from_config({"plugins": {"l2evict": {"exclude": globs}}}).exclude
names = ["a" * 7_990 + f"{i:010d}" for i in range(2_000)]
names[7] = "a" * 3_000 + "b" + "a" * 4_000  # the one name the first glob matches
starts = [i * 4096 for i in range(len(names))]
choice = choose_regions(Storages(names, [4096] * len(names), starts), 1 << 30, exclude)
print(choice.shortfall)
"""


@pytest.mark.slow  # a fresh interpreter (a hang fails by its timeout)
def test_exclude_at_its_limits_over_16_mib_of_names_is_decided_at_once() -> None:
    line = run_python(_AT_THE_LIMITS, timeout=30).strip()
    assert "tensors skipped: 1 excluded)" in line, line


@pytest.mark.parametrize("glob", ["*.layers.?.*", "*a*[0-3]*", "a*.[!x]y.*z"])
def test_a_single_character_wildcard_between_two_stars_is_refused(glob: str) -> None:
    assert wildcard_between_stars(glob)
    with pytest.raises(ConfigError, match=r"'\?' and '\[\.\.\.\]' only before the first '\*'"):
        settings_from_config({"plugins": {"l2evict": {"exclude": [glob]}}})


@pytest.mark.parametrize("glob", ["model.layers.[0-3].*", "*.w?", "a?*b*[xy]", "x[*", "[*]*[*]"])
def test_single_character_wildcards_at_either_end_are_kept(glob: str) -> None:
    assert not wildcard_between_stars(glob)
    exclude = settings_from_config({"plugins": {"l2evict": {"exclude": [glob]}}}).exclude
    assert exclude == (glob,)


def test_a_tensor_that_only_shares_an_excluded_storage_is_not_counted_as_excluded() -> None:
    # One storage of 4,000 bytes viewed by the excluded embedding and by a kept tensor.
    names = ["model.embed_tokens.weight", "model.layers.0.mlp.w", "model.norm"]
    choice = choose_regions(Storages(names, [4000, 4000, 64], [0, 0, 8192]), 1 << 20, ["*.embed*"])
    assert choice.shortfall is not None
    assert "(tensors skipped: 1 excluded, 1 shares a storage with an excluded tensor)" in (
        choice.shortfall
    )
