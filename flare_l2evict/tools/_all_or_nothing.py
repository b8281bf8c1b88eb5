"""Write a set of files into a directory all or nothing: ``example --out DIR``'s writer.

The files are written into a new staging directory inside ``DIR``, then moved
in one by one with :func:`os.replace`; an entry already at a name is first
moved aside into the staging directory (never followed), so it can be put
back. A failure or an interruption before the last move undoes every move
made, removes the staging directory, and removes ``DIR`` and any parent this
call made: ``DIR`` is left as it was. Other files in ``DIR`` are never touched.

Ctrl-C and SIGTERM are held while it runs (in the main thread) and acted on
between steps, so an interruption never lands inside a step and leaves a stray
file behind: the steps are a few small writes, sparse holes and renames, so
holding costs the operator no wait.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from .._errors import L2EvictError
from .._text import shown
from . import _signals

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC
_PREVIOUS = ".previous"  # no file written here ends so: a moved-aside entry never meets a new one

File = tuple[str, bytes, int | None]
"""One file to write: its name, its bytes, and its size (a hole after the bytes)."""


@dataclass
class _Held:
    """The signal that arrived while held, if any."""

    signum: int | None = None

    def check(self) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(self.signum)


@contextlib.contextmanager
def _interrupts_held(settle: bool) -> Iterator[_Held]:
    """Ctrl-C and SIGTERM held for the body; after it, the handlers as they were, or, where
    ``settle`` and the body went through, the running command settled (:mod:`._signals`)."""
    held = _Held()
    if threading.current_thread() is not threading.main_thread():
        yield held  # signals reach the main thread only: nothing to hold here
        return

    def hold(signum: int, _frame: FrameType | None) -> None:
        held.signum = signum

    previous = _signals.changeable()
    done = False
    try:  # installed inside: a signal just after one is set still finds both put back
        for number in previous:
            signal.signal(number, hold)
        yield held
        done = True
    finally:
        with _signals.held():  # put back and settled at once: no signal lands in between
            _signals.put_back(previous)
            if done and settle:
                _signals.settled()


class _FilesLeft(L2EvictError):
    """Some files could not be put back or removed: the message says which, and where."""


def write_all(
    out: Path,
    files: Sequence[File],
    *,
    check: Callable[[Path], None] | None = None,
    settle: bool = False,
) -> None:
    """Make ``out`` (and its missing parents) hold ``files``, every one of them or none.

    ``check(out)`` runs once ``out`` exists, before anything is written; what
    it raises is raised, with ``out`` as it was. Raises :class:`KeyboardInterrupt`
    when interrupted and :class:`L2EvictError` on a failure, each after ``out``
    is back as it was; if even that fails, one :class:`L2EvictError` says what
    is left where. ``settle``: once every file is in, the running command's result is
    settled (:func:`._signals.settled`), so that a command that reports the write ends with
    the exit code its report states.
    """
    with _interrupts_held(settle) as held:
        _Writer(out, held).write(files, check)


class _Writer:
    def __init__(self, out: Path, held: _Held) -> None:
        self.out = out
        self.held = held
        self.where = f"--out {shown(str(out))}"
        self.step = "making the directory"
        self.staging = f".flare-l2evict-{secrets.token_hex(8)}.tmp"

    def write(self, files: Sequence[File], check: Callable[[Path], None] | None) -> None:
        made = _missing(self.out)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            if check is not None:
                check(self.out)
            self.held.check()
            directory = os.open(self.out, _DIRECTORY)
            try:
                self._stage_and_move(directory, files)
            finally:
                os.close(directory)
        except BaseException as error:
            for path in made:  # deepest first; rmdir removes only what is still empty
                try:
                    path.rmdir()
                except FileNotFoundError:
                    continue
                except OSError:
                    break
            if isinstance(error, OSError):
                raise L2EvictError(
                    f"{self.where}: {self.step} failed ({_cause(error)}); nothing written; "
                    "fix: check the directory's permissions and free space, or name another "
                    "directory"
                ) from None
            raise

    def _stage_and_move(self, directory: int, files: Sequence[File]) -> None:
        self.step = "making a staging directory"
        try:
            os.mkdir(self.staging, 0o700, dir_fd=directory)
            stage = os.open(self.staging, _DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            try:
                for name, data, size in files:
                    self.held.check()
                    self.step = f"writing {shown(name)}"
                    _write_new(stage, name, data, size)
                self._move_in(directory, stage, [name for name, _, _ in files])
            finally:
                os.close(stage)
        except _FilesLeft:
            raise  # the staging directory holds the files replaced: keep it, as the error says
        except BaseException:
            try:
                _remove_staging(directory, self.staging)
            except OSError as error:
                raise _FilesLeft(
                    f"{self.where}: {self.step} failed and nothing was written, but the staging "
                    f"directory {shown(self.staging)} could not be removed ({_cause(error)}); "
                    "fix: remove it"
                ) from None
            raise
        try:  # every file is in: the staging directory holds only the files they replaced
            _remove_staging(directory, self.staging)
        except OSError as error:
            raise _FilesLeft(
                f"{self.where}: every file was written, but the staging directory "
                f"{shown(self.staging)}, which holds the files they replaced, could not be "
                f"removed ({_cause(error)}); fix: remove it"
            ) from None

    def _move_in(self, directory: int, stage: int, names: Sequence[str]) -> None:
        """Move each staged file over its name, the entry there aside; undo all on any failure."""
        done: list[tuple[str, bool]] = []  # each name moved in, and whether one was moved aside
        try:
            for name in names:
                self.held.check()
                self.step = f"moving {shown(name)} in"
                aside = _move_aside(directory, stage, name)
                try:
                    os.replace(name, name, src_dir_fd=stage, dst_dir_fd=directory)
                except BaseException:
                    if aside:
                        os.replace(name + _PREVIOUS, name, src_dir_fd=stage, dst_dir_fd=directory)
                    raise
                done.append((name, aside))
            self.held.check()  # the last chance to undo: after this the files are written
        except BaseException as error:
            self._undo(directory, stage, done, error)
            raise

    def _undo(
        self, directory: int, stage: int, done: list[tuple[str, bool]], cause: BaseException
    ) -> None:
        """Put every moved entry back; if that fails, one line saying what is left where."""
        while done:
            name, aside = done[-1]
            try:
                os.replace(name, name, src_dir_fd=directory, dst_dir_fd=stage)
                if aside:
                    os.replace(name + _PREVIOUS, name, src_dir_fd=stage, dst_dir_fd=directory)
            except OSError as error:
                left = ", ".join(shown(n, 60) for n, _ in done)
                what = "was interrupted" if isinstance(cause, KeyboardInterrupt) else "failed"
                raise _FilesLeft(
                    f"{self.where}: {self.step} {what}, and putting the directory back failed "
                    f"at {shown(name)} ({_cause(error)}): it holds some of the new files "
                    f"({left}), and {shown(self.staging)} holds the files they replaced; fix: "
                    f"move each file of {shown(self.staging)} back by hand, dropping "
                    f"'{_PREVIOUS}', then remove it"
                ) from None
            done.pop()


def _cause(error: OSError) -> str:
    return shown(error.strerror or str(error), 120)


def _missing(out: Path) -> list[Path]:
    """``out`` and its parents that do not exist yet, deepest first: what ``mkdir`` will make."""
    missing = []
    for path in (out, *out.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    return missing


def _write_new(stage: int, name: str, data: bytes, size: int | None) -> None:
    """Create ``name`` in the staging directory: ``data``, then a hole up to ``size``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    with os.fdopen(os.open(name, flags, 0o666, dir_fd=stage), "wb") as handle:
        handle.write(data)
        if size is not None:
            handle.truncate(size)


def _move_aside(directory: int, stage: int, name: str) -> bool:
    """Move the entry at ``name`` (a file or link, never followed) into staging; say if one was."""
    try:
        found = os.lstat(name, dir_fd=directory)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(found.st_mode):
        raise IsADirectoryError(21, "a directory is at that name now", name)
    os.replace(name, name + _PREVIOUS, src_dir_fd=directory, dst_dir_fd=stage)
    return True


def _remove_staging(directory: int, staging: str) -> None:
    """Remove the staging directory and what it holds (files and links only: it is ours)."""
    try:
        stage = os.open(staging, _DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
    except FileNotFoundError:
        return
    try:
        for name in os.listdir(stage):
            os.unlink(name, dir_fd=stage)
    finally:
        os.close(stage)
    os.rmdir(staging, dir_fd=directory)
