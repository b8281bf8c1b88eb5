"""The start-up's phase: one table of moves, one function that applies it, docs that match it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from flare_l2evict import _startup
from flare_l2evict._report import HOST
from flare_l2evict._startup import NEXT, Event, Phase, PhaseError, Startup

ROOT = Path(__file__).resolve().parents[1]
_MOVE = re.compile(r"^ {4}([A-Z_]+) +--([a-z]+)--> +([A-Z_]+)$", re.M)


def _moves(text: str) -> set[tuple[Phase, Event, Phase]]:
    return {(Phase[a], Event[e.upper()], Phase[b]) for a, e, b in _MOVE.findall(text)}


def _table_moves() -> set[tuple[Phase, Event, Phase]]:
    return {(phase, event, to) for (phase, event), to in NEXT.items() if to is not phase}


def test_the_docs_draw_every_move_of_the_table_and_no_other() -> None:
    drawn = _moves((ROOT / "docs" / "internals.md").read_text())
    assert drawn == _table_moves()


def test_the_codes_move_lines_are_the_table() -> None:
    assert _moves(_startup._MOVES) == _table_moves()
    assert len(_MOVE.findall(_startup._MOVES)) == len(_table_moves())  # none twice


@pytest.mark.parametrize(
    "event", [Event.RESTORE, Event.END, Event.SETTLE, Event.ESCAPE, Event.FORKED]
)
def test_the_events_that_never_raise_have_a_move_in_every_phase(event: Event) -> None:
    assert {phase for phase, e in NEXT if e is event} == set(Phase)


def test_ended_is_final() -> None:
    assert all(to is Phase.ENDED for (phase, _), to in NEXT.items() if phase is Phase.ENDED)


def test_every_phase_but_begun_is_reached_and_every_phase_can_end() -> None:
    reached = {to for _, _, to in _table_moves()}
    assert reached == set(Phase) - {Phase.BEGUN}
    assert all(NEXT[phase, Event.END] in (Phase.ENDED, Phase.ENDING) for phase in Phase)


def test_a_pair_the_table_does_not_have_raises_and_moves_nothing() -> None:
    startup = Startup(object(), object(), HOST)  # never begun: no slot is taken
    startup.phase = Phase.CREDITED
    with pytest.raises(PhaseError, match="offer in phase credited: not in the table"):
        startup._step(Event.OFFER)
    assert startup.phase is Phase.CREDITED
    assert startup._step(Event.RESTORE) is Phase.CUT_SHORT


def test_only_the_step_function_writes_the_phase() -> None:
    tree = ast.parse((ROOT / "flare_l2evict" / "_startup.py").read_text())
    writers = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "phase" for t in targets):
                writers.add(function.name)
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "setattr"
                and any(isinstance(a, ast.Constant) and a.value == "phase" for a in node.args)
            ):
                writers.add(function.name)
    assert writers == {"__init__", "_step"}
