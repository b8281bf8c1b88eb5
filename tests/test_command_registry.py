"""One registry of commands: the parser, ``--help``'s examples, the dispatch and the generated
command reference all come from it (issue 42), and what every command shares: the exit code
an interrupted or finished run gives, progress on stderr, a misspelled flag's nearest one.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.scripts import script

from flare_l2evict.tools._signals import settled, temporary_directory
from flare_l2evict.tools.cli import COMMANDS, Command, example, main, plan
from flare_l2evict.tools.cli._shared import Exits, Listed, Parser, parser


def _stand_in_arguments(parser: Parser, _commands: Sequence[Listed]) -> None:
    parser.add_argument("--times", type=int, default=1)


ran: list[int] = []


def _stand_in_run(args: argparse.Namespace) -> int:
    ran.append(args.times)
    return 0


STAND_IN = Command(
    name="greet",
    help="a stand-in command, registered by a test",
    example="greet --times 2",
    exits=Exits("greeted"),
    arguments=_stand_in_arguments,
    run=_stand_in_run,
)
"""A command that exists only here: adding one is its declaration plus one registry entry."""


def test_a_command_added_to_the_registry_is_in_help_examples_dispatch_and_the_reference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands: tuple[Listed, ...] = (*COMMANDS, STAND_IN)
    with pytest.raises(SystemExit):
        main(["--help"], commands)
    assert "greet" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["greet", "--help"], commands)
    text = capsys.readouterr().out
    assert "example:\n  flare-l2evict greet --times 2" in text and "  0    greeted" in text
    assert main(["greet", "--times", "3"], commands) == 0 and ran[-1] == 3
    reference = script("command_line_docs").reference(commands)
    assert "### `flare-l2evict greet`" in reference and "`--times TIMES`" in reference
    with pytest.raises(SystemExit) as exited:
        main(["greet"])  # not registered: unknown to the real CLI
    assert exited.value.code == 2


def test_the_docs_command_reference_and_field_tables_are_the_registrys() -> None:
    generator = script("command_line_docs")
    page = generator.PAGE.read_text(encoding="utf-8")
    assert page == generator.regenerated(page), (
        f"docs/command-line.md's command reference or JSON field tables differ from the "
        f"commands and their models; regenerate them: {generator.REGENERATE}"
    )


def test_every_command_of_the_registry_is_one_subcommand_in_its_order() -> None:
    top = parser(COMMANDS, "0")
    assert list(top.commands) == [c.name for c in COMMANDS]
    assert [c.name for c in COMMANDS] == ["startup", "plan", "check", "example", "schema"]


def _interrupted(_args: argparse.Namespace) -> int:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["plan", "x.safetensors"], "error: flare-l2evict plan: interrupted; fix: run the command"),
        (["check"], "error: flare-l2evict check: interrupted; fix: run the command"),
        # Without a CHECKPOINT, startup writes the embedded example to a temporary directory.
        (["startup"], "error: flare-l2evict startup: interrupted; temporary files removed; fix:"),
        (["startup", "m.safetensors"], "error: flare-l2evict startup: interrupted; fix: run"),
    ],
)
def test_only_a_command_that_wrote_temporary_files_says_it_removed_them(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    commands = [dataclasses.replace(c.load(), run=_interrupted) for c in COMMANDS]
    assert main(argv, commands) == 130
    assert capsys.readouterr().err.startswith(said)


def _interrupt_after_printing(*printed: Any, **how: Any) -> None:
    print(*printed, **how)
    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, once the output is out


@pytest.mark.usefixtures("interruptible")
def test_once_the_output_is_complete_the_exit_code_is_the_one_it_states(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Issue 41: a SIGINT after a complete JSON object exited 130 though the object said 0,
    # and after "wrote 10 files" example said "nothing written".
    monkeypatch.setattr(plan, "print", _interrupt_after_printing, raising=False)
    monkeypatch.setattr(example, "print", _interrupt_after_printing, raising=False)
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1 << 18)}, str(tmp_path / "m.safetensors"))
    code = main(["plan", str(tmp_path / "m.safetensors"), "--json"])
    out = capsys.readouterr().out
    assert code == 1 and '"exit_code": 1' in out
    assert main(["example", "--out", str(tmp_path / "example")]) == 0
    said = capsys.readouterr()
    assert "wrote 10 files" in said.out and "nothing written" not in said.err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


@pytest.mark.usefixtures("interruptible")
def test_settled_outside_a_command_leaves_the_programs_handlers() -> None:
    settled()  # a program calling a command's function directly: its handlers are its own
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_startup_says_each_long_step_on_stderr_and_q_silences_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    demo = ["startup", "--plugin", "l2evict", "--profile", "h100"]
    assert main(demo) == 0
    steps = [line for line in capsys.readouterr().err.splitlines() if "flare-l2evict " in line]
    assert steps == [
        "INFO flare-l2evict startup: writing the embedded example checkpoint (sparse) to a "
        "temporary dir",
        "INFO flare-l2evict startup: without plugins: loading the checkpoint on cpu, then 5 race "
        "jobs",
        "INFO flare-l2evict startup: --plugin l2evict: loading the checkpoint on cpu, then the "
        "hooks and 5 race jobs",
    ]
    assert main([*demo, "-q"]) == 0
    assert "INFO" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "nearest"),
    [
        (["plan", "x", "--race-job", "3"], "did you mean --race-jobs?"),
        (["check", "--jsn"], "did you mean --json?"),
        (["plan", "x", "--profile", "h10"], "did you mean h100?"),
        (["startup", "--kv-sizing", "measure"], "did you mean measured?"),
        (["chek"], "did you mean check?"),
        (["check", "--device", "cudaa"], "did you mean cuda?"),  # issue 46: none before
        (["startup", "--device", "cuda1"], "did you mean cuda:1?"),
        (["check", "--device", "gpu"], None),
        (["plan", "x", "--bogus"], None),
    ],
)
def test_a_misspelled_flag_or_choice_gets_the_nearest(
    capsys: pytest.CaptureFixture[str], argv: list[str], nearest: str | None
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    (line,) = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2 and line.startswith("error: flare-l2evict")
    if nearest is None:
        assert "did you mean" not in line
    else:
        assert f"; fix: {nearest} (see flare-l2evict" in line, line


def test_a_command_without_decisions_does_not_promise_decision_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("example", "schema"):
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "how the plugin decided" not in text and f"{name} has none" in text, name


@pytest.mark.slow  # a fresh interpreter of the command line
def test_a_reader_that_stops_reading_ends_the_command_quietly() -> None:
    # `flare-l2evict check | head -2` printed "error: ... Broken pipe (no file)" as if a path
    # were wrong; a closed stdout is the reader's choice: no line, exit 141 as a shell says it.
    import subprocess
    import sys

    with subprocess.Popen(
        [sys.executable, "-m", "flare_l2evict", "schema", "check"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()  # the reader leaves before the command writes
        err = child.stderr.read()
        assert child.wait(timeout=120) == 141 and err == b"", err


def _a_programs_handler(signum: int, _frame: object) -> None:
    raise AssertionError(f"the program's own handler ran for signal {signum}")


@pytest.mark.usefixtures("interruptible")
def test_a_sigterm_the_moment_the_command_takes_it_still_gives_the_handler_back(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Issue 41: installed before its try, a SIGTERM right after left the command's handler
    # in a program that called main() (and so did a signal between example's two).
    real = signal.signal

    def term_once_set(number: int, handler: Any) -> Any:
        before = real(number, handler)
        if number == signal.SIGTERM and handler not in (signal.SIG_IGN, _a_programs_handler):
            os.kill(os.getpid(), signal.SIGTERM)  # the operator's SIGTERM lands right now
        return before

    inherited = real(signal.SIGTERM, _a_programs_handler)
    try:
        monkeypatch.setattr(signal, "signal", term_once_set)
        code = main(["example", "--out", str(tmp_path / "ex")])
        monkeypatch.undo()
        after = signal.getsignal(signal.SIGTERM)
    finally:
        real(signal.SIGTERM, inherited)
    assert code == 130 and "interrupted" in capsys.readouterr().err
    assert after is _a_programs_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("interruptible")
def test_a_handler_python_cannot_see_is_left_alone(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Issue 41: in an embedding C host, getsignal() is None for the host's own handlers; a
    # command put SIG_DFL in their place. (Stand-in: that host cannot exist in a test
    # process, so getsignal says None for SIGTERM, as it would there.)
    seen = signal.getsignal

    def as_in_a_c_host(number: int) -> Any:
        return None if number == signal.SIGTERM else seen(number)

    changed: list[int] = []
    real = signal.signal

    def recorded(number: int, handler: Any) -> Any:
        changed.append(number)
        return real(number, handler)

    monkeypatch.setattr(signal, "getsignal", as_in_a_c_host)
    monkeypatch.setattr(signal, "signal", recorded)
    assert main(["example", "--out", str(tmp_path / "ex")]) == 0
    assert "wrote 10 files" in capsys.readouterr().out
    assert signal.SIGTERM not in changed and signal.SIGINT in changed


def test_each_registry_entry_is_its_modules_declaration() -> None:
    # Issue 46: the registry names each command's module, and only the one that runs is
    # imported; its summary and whether it prints --json are said there once more.
    for entry in COMMANDS:
        command = entry.load()
        assert (command.name, command.help, command.json) == (entry.name, entry.help, entry.json)


def _a_programs_sigterm(signum: int, _frame: object) -> None:
    """A program's own SIGTERM handler (never called here: no SIGTERM is sent)."""


@pytest.mark.usefixtures("interruptible")
def test_a_ctrl_c_as_the_handlers_are_put_back_ends_with_the_commands_own_code(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Issue 46: a Ctrl-C just after SIGINT was put back, before SIGTERM was, returned 130
    # after example had printed "wrote 10 files" and written them, and left SIGTERM ignored
    # for a program that calls main(). A real SIGINT each time SIGINT's handler is put back.
    real = signal.signal
    sent: list[int] = []

    def ctrl_c_as_sigint_is_put_back(number: int, handler: Any) -> Any:
        before = real(number, handler)
        if number == signal.SIGINT and handler is signal.default_int_handler:
            sent.append(number)
            os.kill(os.getpid(), signal.SIGINT)  # before SIGTERM's is put back
        return before

    inherited = real(signal.SIGTERM, _a_programs_sigterm)
    try:
        monkeypatch.setattr(signal, "signal", ctrl_c_as_sigint_is_put_back)
        code = main(["example", "--out", str(tmp_path / "ex")])
        monkeypatch.undo()
        after = signal.getsignal(signal.SIGTERM)
    finally:
        real(signal.SIGTERM, inherited)
    said = capsys.readouterr()
    assert sent and code == 0, said.err
    assert "wrote 10 files" in said.out and said.err == ""
    assert len(list((tmp_path / "ex").iterdir())) == 10
    assert after is _a_programs_sigterm
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _ctrl_c_after(call: Any) -> Any:
    """``call``, then a real SIGINT sent to this process: Ctrl-C just after it returned."""

    def then_ctrl_c(*args: Any, **kwargs: Any) -> Any:
        done = call(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return done

    return then_ctrl_c


def _ctrl_c_half_way(rmtree: Any) -> Any:
    """``shutil.rmtree`` that removes one file, then meets a real Ctrl-C, once."""
    sent: list[bool] = []

    def half_way(path: str, *args: Any, **kwargs: Any) -> Any:
        if not sent:
            sent.append(True)
            next(Path(path).iterdir()).unlink()
            os.kill(os.getpid(), signal.SIGINT)
        return rmtree(path, *args, **kwargs)

    return half_way


@pytest.mark.parametrize("at", ["made", "removing"])
def test_a_ctrl_c_as_startups_temporary_dir_is_made_or_removed_leaves_nothing(
    at: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Ctrl-C sweep (tests/test_ctrl_c_from_spawn.py) once caught `startup` saying
    # "temporary files removed" with its scratch dir left in TMPDIR: the interrupt landed
    # just after mkdtemp made it (before anything owned it), or inside the removal.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            if at == "made":
                monkeypatch.setattr(os, "mkdir", _ctrl_c_after(os.mkdir))
            with temporary_directory("flare-l2evict-") as scratch:
                if at == "removing":
                    monkeypatch.setattr(shutil, "rmtree", _ctrl_c_half_way(shutil.rmtree))
                Path(scratch, "a").write_text("x")
                Path(scratch, "b").write_text("x")
    finally:
        signal.signal(signal.SIGINT, previous)
        monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
