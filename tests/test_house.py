"""The house rules a reviewer would otherwise check by hand (issue 22)."""

from __future__ import annotations

import ast
from pathlib import Path

import flare_l2evict

RUNTIME = Path(flare_l2evict.__file__).parent
LIMIT = 50


def test_no_runtime_function_is_over_fifty_lines() -> None:
    # The runtime is what a server imports: flare_l2evict/*.py, not tools/. Lines
    # count from `def` to the last line, docstring included.
    long: list[str] = []
    for path in sorted(RUNTIME.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], f"runtime functions over {LIMIT} lines: {long}"
