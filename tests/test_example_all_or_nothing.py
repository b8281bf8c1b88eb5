"""``example --out DIR`` writes all its files or none (issue 35, item 6).

Interrupted right after a temporary file was made, it left the file and said
temporary files were removed; failing at its 9th file, it exited 2 saying
"nothing written" with 8 files written. Here every interruption and failure,
at every stage, leaves DIR as it was: the operator's own files, the files an
earlier example wrote (their old bytes), and no temporary entry.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from flare_l2evict._text import shown
from flare_l2evict.tools import _all_or_nothing, _example, main
from flare_l2evict.tools._example import EXAMPLE_FILES

_OLD = b"an earlier example's model.safetensors\n"


def _before(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """DIR holding the operator's own file and one file an earlier example wrote."""
    out = tmp_path / "ex"
    out.mkdir()
    (out / "notes.txt").write_bytes(b"the operator's own notes\n")
    (out / "model.safetensors").write_bytes(_OLD)
    return out, _contents(out)


def _contents(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}


def _run(capsys: pytest.CaptureFixture[str], out: Path) -> tuple[int, str]:
    code = main(["example", "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert stdout == "" and stderr.count("\n") == 1, (stdout, stderr)
    return code, stderr


def _on_call(
    number: int, then: Callable[[], None], real: Callable[..., None]
) -> Callable[..., None]:
    """``real``, which runs ``then`` right after its ``number``-th call (counted from 1)."""
    calls = 0

    def wrapped(*args: object, **kwargs: object) -> None:
        nonlocal calls
        real(*args, **kwargs)
        calls += 1
        if calls == number:
            then()

    return wrapped


def _interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("number", [1, 6, len(EXAMPLE_FILES)])
def test_an_interruption_right_after_a_file_is_made_leaves_the_directory_as_it_was(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    number: int,
) -> None:
    out, before = _before(tmp_path)
    monkeypatch.setattr(
        _all_or_nothing, "_write_new", _on_call(number, _interrupt, _all_or_nothing._write_new)
    )
    code, err = _run(capsys, out)
    assert code == 130
    assert err == (
        f"error: flare-l2evict example: interrupted; nothing written to {shown(str(out))}; "
        "fix: run the command again\n"
    )
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "notes.txt"]
    assert _contents(out) == before


@pytest.mark.usefixtures("interruptible")
def test_ctrl_c_while_the_files_are_moved_in_puts_every_one_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SIGINT after the 3rd rename: held, then every rename made is undone."""
    out, before = _before(tmp_path)

    def ctrl_c() -> None:
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", _on_call(3, ctrl_c, os.replace))
    code, err = _run(capsys, out)
    assert code == 130 and "interrupted; nothing written to" in err
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "notes.txt"]
    assert _contents(out) == before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


def test_a_write_that_fails_at_the_ninth_file_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, before = _before(tmp_path)

    def disk_full() -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(
        _all_or_nothing, "_write_new", _on_call(9, disk_full, _all_or_nothing._write_new)
    )
    code, err = _run(capsys, out)
    assert code == 2
    assert (
        f"--out {shown(str(out))}: writing {EXAMPLE_FILES[8]} failed (No space left on device); "
        in err
    )
    assert "; nothing written; fix: check the directory's permissions and free space" in err
    assert _contents(out) == before and len(list(out.iterdir())) == 2


def test_a_directory_planted_at_a_name_undoes_the_files_already_moved_in(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real fault midway: a file cannot replace a directory, so the 8th move fails."""
    out, before = _before(tmp_path)
    checked = _example._refuse_links
    planted = EXAMPLE_FILES[7]

    def check_then_plant(directory: Path) -> None:
        checked(directory)  # the real check: nothing to refuse yet
        (directory / planted).mkdir()

    monkeypatch.setattr(_example, "_refuse_links", check_then_plant)
    code, err = _run(capsys, out)
    assert code == 2
    assert f"moving {planted} in failed (a directory is at that name now); nothing written" in err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["model.safetensors", "notes.txt", planted]
    )
    assert _contents(out) == before  # model.safetensors, moved in first, holds its old bytes


def test_an_interrupted_example_removes_the_directories_it_made(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        _all_or_nothing, "_write_new", _on_call(2, _interrupt, _all_or_nothing._write_new)
    )
    code, _ = _run(capsys, tmp_path / "new" / "ex")
    assert code == 130 and list(tmp_path.iterdir()) == []


def test_an_undo_that_fails_says_what_is_left_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flare_l2evict._errors import L2EvictError

    out, _ = _before(tmp_path)
    real = os.replace
    calls = 0

    def replace(*args: object, **kwargs: object) -> None:
        nonlocal calls
        calls += 1
        # 1, 2: the old model.safetensors aside, the new one in; 3: the first shard in;
        # 4: the second shard's move fails; 5: the undo's first rename fails too.
        if calls in (4, 5):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(L2EvictError) as failed:
        _example.write_example(out, 64 << 20)
    message = str(failed.value)
    (staging,) = [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert (
        "putting the directory back failed at model-00001-of-00002.safetensors (Input/output"
        in (message)
    )
    assert f"{staging.name} holds the files they replaced" in message
    assert (staging / "model.safetensors.previous").read_bytes() == _OLD
    assert "\n" not in message and len(message) < 1000


def test_a_second_example_replaces_the_first_and_leaves_no_staging(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out, _ = _before(tmp_path)
    for _ in range(2):
        assert main(["example", "--out", str(out)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == sorted([*EXAMPLE_FILES, "notes.txt"])
    assert (out / "model.safetensors").read_bytes() != _OLD


def test_a_signal_the_caller_ignores_stays_ignored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started with `&` from a script (SIGINT and SIGTERM ignored), a Ctrl-C at the terminal
    must not stop the command: it writes every file, exits 0, and leaves both ignored."""
    out, _ = _before(tmp_path)
    inherited = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}

    def ctrl_c_and_term() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "replace", _on_call(3, ctrl_c_and_term, os.replace))
    for number in inherited:
        signal.signal(number, signal.SIG_IGN)
    try:
        code = main(["example", "--out", str(out)])
        after = {n: signal.getsignal(n) for n in inherited}
    finally:
        for number, handler in inherited.items():
            signal.signal(number, handler)
    said = capsys.readouterr()
    assert code == 0 and "wrote 10 files" in said.out, said
    assert sorted(p.name for p in out.iterdir()) == sorted({*EXAMPLE_FILES, "notes.txt"})
    assert after == {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}
