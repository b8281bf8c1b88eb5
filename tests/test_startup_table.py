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


def _functions() -> list[ast.FunctionDef]:
    tree = ast.parse((ROOT / "flare_l2evict" / "_startup.py").read_text())
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


def test_what_follows_a_move_is_decided_in_one_place() -> None:
    # Issue 42: "ENDED -> close; FELL_BACK after an install -> restore" was written in five
    # methods; now each lands its move and hands the phase to Startup._after.
    calling_restore = set()
    for function in _functions():
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "restore":
                calling_restore.add(function.name)
    assert calling_restore == {"_after", "restore"}  # restore(): the module's, for operators
    handing = {
        function.name
        for function in _functions()
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "_after"
    }
    assert handing == {"_after_fork_in_child", "install", "offered", "settle", "_end"}


def test_no_method_spells_a_set_of_phases_inline() -> None:
    # Issue 42: each set of phases a method tests has a name beside _STANDS and _MID_STEP.
    spelled = []
    for function in _functions():
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Tuple | ast.Set | ast.List)
                and sum(
                    isinstance(item, ast.Attribute) and getattr(item.value, "id", None) == "Phase"
                    for item in node.elts
                )
                > 1
            ):
                spelled.append(f"{function.name}:{node.lineno}")
    assert spelled == []


def test_a_start_up_that_offered_nothing_falls_back_as_its_caller_leaves() -> None:
    # The caller's exit is a move to FELL_BACK wherever nothing was offered (or kept): the
    # restore follows from the phase, in _after, not from a list of phases in settle.
    for phase in (Phase.BEGUN, Phase.INSTALLING, Phase.INSTALLED, Phase.FALLING_BACK):
        assert NEXT[phase, Event.SETTLE] is Phase.FELL_BACK, phase
    for phase in (Phase.OFFERING, Phase.KEPT, Phase.CREDITED, Phase.CUT_SHORT):
        assert NEXT[phase, Event.SETTLE] not in _startup._OVER, phase
