"""Rewrite docs/command-line.md's JSON field tables from the models they describe.

The tables are generated (``flare_l2evict/tools/_json_models.py``'s
``field_tables``) and ``tests/test_json_output.py`` holds the page equal to
them: after changing a model, run this and commit the page.

    python scripts/json_fields.py
"""

from __future__ import annotations

from pathlib import Path

from flare_l2evict.tools._json_models import with_field_tables

PAGE = Path(__file__).resolve().parents[1] / "docs" / "command-line.md"


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    updated = with_field_tables(text)
    if updated != text:
        PAGE.write_text(updated, encoding="utf-8")
    print(f"{PAGE.name}: {'rewritten' if updated != text else 'already up to date'}")


if __name__ == "__main__":
    main()
