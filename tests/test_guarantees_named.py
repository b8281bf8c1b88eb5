"""Each promise of docs/guarantees.md names the tests that hold it, and every test it names exists.

The page is for operators: under each bold-headed promise, one "Held by:" paragraph lists
the strongest few tests, each as ``tests/test_x.py::test_name`` (a parametrized test by its
function's name). A test renamed, moved or deleted fails here, naming the promise that lost
it; a promise added without its tests fails too.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUARANTEES = ROOT / "docs" / "guarantees.md"
_PROMISE = re.compile(r"^- \*\*(.+?)\*\*", re.M)
_HELD_BY = "Held by: "
_NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def promises() -> dict[str, str]:
    """Each bold-headed bullet of the page by its heading (``Never worse than stock.``): its
    whole text, continuation paragraphs included, up to the next bullet or the page's end."""
    text = GUARANTEES.read_text(encoding="utf-8")
    starts = list(_PROMISE.finditer(text))
    return {
        found.group(1): text[found.start() : starts[i + 1].start() if i + 1 < len(starts) else None]
        for i, found in enumerate(starts)
    }


def held_by(promise: str) -> list[tuple[str, str]]:
    """The tests one promise's "Held by:" paragraph names: (file, function), in order."""
    _, found, rest = promise.partition(_HELD_BY)
    return _NAMED.findall(rest) if found else []


@functools.cache
def defined_tests(path: str) -> frozenset[str]:
    """The test functions a test file defines at its top level (what pytest collects there)."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return frozenset(
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    )


def test_the_page_has_its_promises() -> None:
    # Not vacuous: the five the README lists are among the bullets parsed (more may come).
    assert {
        "Never worse than stock.",
        "One credit, always backed.",
        "Never over-reports.",
        "Never writes to weights.",
        "Holds nothing after start-up.",
    } <= set(promises())


@pytest.mark.parametrize("heading", list(promises()))
def test_every_promise_names_the_tests_that_hold_it(heading: str) -> None:
    text = promises()[heading]
    assert text.count(_HELD_BY) == 1, (
        f"{heading}: one {_HELD_BY!r} paragraph, not {text.count(_HELD_BY)}"
    )
    named = held_by(text)
    assert named, f"{heading}: its {_HELD_BY!r} paragraph names no tests/test_x.py::test_name"
    assert len(set(named)) == len(named), f"{heading}: a test named twice"


@pytest.mark.parametrize("heading", list(promises()))
def test_every_test_a_promise_names_exists(heading: str) -> None:
    for path, name in held_by(promises()[heading]):
        assert (ROOT / path).is_file(), f"{heading}: {path} is no file"
        assert name in defined_tests(path), f"{heading}: {path} has no test {name}"


def test_a_missing_or_renamed_test_is_caught() -> None:
    # The check above can fail: a name that is not a test of its file is not found.
    (path, name), *_ = held_by(promises()["Never worse than stock."])
    assert name in defined_tests(path)
    assert f"{name}_renamed" not in defined_tests(path)
    assert held_by("- **A promise.** Nothing holds it.") == []
