"""Echoed values: at most 200 characters, one line, nothing invisible, in bounded time.

Case -> outcome: a value whose ``repr`` is slow or huge (a list of 100,000
tensors, a 200,000-entry mapping, a class whose ``__repr__`` must not run) ->
named in bounded time, by type where its repr is the host's own code.
"""

from __future__ import annotations

import time

import pytest
import torch

from flare_l2evict._text import LIMIT, described_value, literal, shown
from flare_l2evict.tools.cli._shared import one_line


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("model.layers.0.mlp", "model.layers.0.mlp"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("nul\x00esc\x1bdel\x7f", "nul\\x00esc\\x1bdel\\x7f"),
        ("c1\x85", "c1\\x85"),
        ("rlo\u202eexe.txt", "rlo\\u202eexe.txt"),  # Cf: bidi override
        ("iso\u2066x\u2069", "iso\\u2066x\\u2069"),  # Cf: bidi isolates
        ("zw\u200bj\u200d", "zw\\u200bj\\u200d"),  # Cf: zero-width space and joiner
        ("bom\ufeff", "bom\\ufeff"),
        ("ls\u2028ps\u2029", "ls\\u2028ps\\u2029"),  # Zl, Zp
        ("tag\U000e0041", "tag\\U000e0041"),  # Cf outside the BMP
        ("bad\udcff.bin", "bad\\udcff.bin"),  # Cs: an undecodable file name byte
        ("日本語 é ü", "日本語 é ü"),  # printable non-ASCII stays as it is
    ],
)
def test_hidden_characters_are_escaped(value: str, expected: str) -> None:
    assert shown(value) == expected


def test_long_values_are_cut_with_their_length() -> None:
    text = shown("x" * 10_000_000)
    assert len(text) == LIMIT and text.endswith("...[10,000,000 chars]")
    assert len(shown("\n" * 1000, 50)) <= 50  # escapes count against the limit


def test_a_huge_value_costs_what_a_short_one_does() -> None:
    huge = "\u202e" * 50_000_000
    started = time.perf_counter()
    shown(huge)
    assert time.perf_counter() - started < 0.05


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-5, "-5"),
        ("lots", '"lots"'),
        (True, "true"),
        (None, "null"),
        ([1, "a"], '[1, "a"]'),
        ({"k": [1.5]}, '{"k": [1.5]}'),
        ("a\u202eb\n", '"a\\u202eb\\n"'),
        (object(), "<object>"),
    ],
)
def test_literals_are_json_like(value: object, expected: str) -> None:
    assert literal(value) == expected


def test_a_huge_int_is_named_by_its_size() -> None:
    # str() refuses an int of more than 4,300 digits; a config could hold one.
    assert literal(10**5000) == "<int of 16,610 bits>"


def test_literals_of_large_or_deep_values_are_bounded() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert literal(deep) == "[[[[[...]]]]]"
    many = literal(list(range(1_000_000)))
    assert len(many) <= LIMIT and many.endswith("...")
    assert len(literal({"k" * 10_000_000: "v" * 10_000_000})) <= LIMIT


def test_one_line_is_at_most_1_kb_of_utf8() -> None:
    for message in ("é" * 5000, "\n" * 5000, "a" * 100_000, "日本" * 1000):
        line = one_line(message)
        assert "\n" not in line and len(line.encode()) < 1024
    assert one_line("short\nmessage") == "short\\nmessage"


class ReprMustNotRunStandIn:
    """A host object whose ``__repr__`` would walk a whole model (here: fails the test)."""

    def __repr__(self) -> str:
        raise AssertionError("the host's __repr__ ran")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (ReprMustNotRunStandIn(), "<a ReprMustNotRunStandIn>"),
        ([torch.zeros(1)] * 100_000, "[<Tensor>, <Tensor>"),
        ({i: None for i in range(200_000)}, "{0: null, 1: null"),
        (torch.zeros(1000, 1000), "<a Tensor of shape (1000, 1000) (torch.float32)>"),
        ("n" * 10**6, "...[1,000,000 chars]"),
        (10**5000, "<int of 16,610 bits>"),
    ],
    ids=["host-repr", "100k-tensors", "200k-mapping", "tensor", "long-str", "huge-int"],
)
def test_values_are_described_in_bounded_time(value: object, expected: str) -> None:
    text = described_value(value, 80)
    assert expected in text and len(text) <= 80 and "\n" not in text
