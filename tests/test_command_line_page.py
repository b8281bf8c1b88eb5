"""docs/command-line.md's own words about the commands agree with the registry.

Case -> outcome: the page's first sentence counts the commands -> the registry's count
("All six commands" stood there while there were five).
"""

from __future__ import annotations

from pathlib import Path

from flare_l2evict.tools.cli import COMMANDS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "command-line.md"
_NUMBERS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def test_the_page_counts_the_commands_the_registry_holds() -> None:
    first = PAGE.read_text(encoding="utf-8").split("\n\n")[1]
    assert first.startswith(f"All {_NUMBERS[len(COMMANDS) - 1]} commands;"), first[:40]
