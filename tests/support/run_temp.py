"""The test run's own temporary directory, gone when the run ends, however it ends.

Everything the run writes goes under it: pytest's ``tmp_path`` roots and whatever the code
under test, or a process it starts, puts in the system temp dir. A passed run removes it; so
does a failed or interrupted one, unless ``FLARE_L2EVICT_KEEP_TMP=1`` asks to keep it, and then
the run's last line names it. A run that never gets to say (killed, or its interpreter dies)
is cleaned after by a watcher process, which removes it, or keeps and names it on request.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEEP = "FLARE_L2EVICT_KEEP_TMP"

# Linux's sun_path holds 107 characters. The fork server's socket is
# <dir>/pymp-XXXXXXXX/listener-XXXXXXXX: 32 characters past its directory.
_SOCKET_ROOM = 107 - 32
_SHORT_TEMP_DIRS = ("/tmp", "/var/tmp", "/usr/tmp")  # where CPython 3.14 looks in this case

_THIS_FILE = str(Path(__file__).resolve())


def keep_requested() -> bool:
    """Whether the operator asked a failed or interrupted run to keep its directory."""
    return os.environ.get(KEEP, "").strip() not in ("", "0")


def multiprocessing_temp_dir() -> str:
    """Make multiprocessing's own temp dir (the gloo ranks' fork server's socket) now, in the
    system temp dir, and return it.

    Made before the run's directory and outside it: multiprocessing removes it at exit, after
    the run's directory is gone. Under a temp dir too long for the socket's address (a long
    ``TMPDIR``), it goes in a short one such as ``/tmp`` instead, as CPython 3.14 does itself:
    otherwise every test that spawns a rank fails with "AF_UNIX path too long".
    """
    import multiprocessing.util

    if len(tempfile.gettempdir()) > _SOCKET_ROOM:
        tempfile.tempdir = next(
            (d for d in _SHORT_TEMP_DIRS if os.access(d, os.W_OK | os.X_OK)), None
        )
    try:
        return multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


class RunTemp:
    """The directory, and the watcher that removes it if this process ends without saying."""

    def __init__(self, *, also: tuple[str, ...] = ()) -> None:
        """Make the directory in the system temp dir and start its watcher.

        ``also``: directories the watcher removes with it if the run dies (multiprocessing's,
        whose own clean-up at exit is lost with the run then).
        """
        self.path = tempfile.mkdtemp(prefix="flare-l2evict-tests-")
        self.keep = keep_requested()
        # This file as a script, on the standard library alone (-E -s -S): it starts in 20 ms.
        # Its own session: a Ctrl-C or a signal to the run's process group does not reach it.
        # It reads its stdin to the end: end of file without a word means the run is gone, and
        # so are the processes forked from it, which hold the pipe's other end too.
        self._watcher = subprocess.Popen(
            [
                sys.executable,
                "-E",
                "-s",
                "-S",
                _THIS_FILE,
                "1" if self.keep else "0",
                self.path,
                *also,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._closed = False

    def close(self, *, passed: bool) -> str | None:
        """Remove the directory, or keep it (a run that did not pass, on request) and return
        its path. Only the first call acts."""
        if self._closed:
            return None
        self._closed = True
        kept = not passed and self.keep
        if not kept:
            remove(self.path)
        assert self._watcher.stdin is not None
        try:
            self._watcher.stdin.write(b"finished\n")  # the watcher leaves the directory alone
            self._watcher.stdin.close()
        except OSError:  # the watcher is gone (killed with the run's group): nothing to tell
            pass
        self._watcher.wait(timeout=60)
        return self.path if kept else None


def remove(path: str) -> None:
    """Remove ``path`` and everything under it, sparse files and all.

    Tried again a few times: a process that outlives the run may still be making files in it,
    and one made during a pass leaves its directory not empty.
    """
    for _ in range(10):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.1)


def kept_line(path: str) -> str:
    """The run's last line when it keeps its directory."""
    return f"the run's temporary files are kept in {path} (asked by {KEEP}=1)"


def _watch(keep: bool, path: str, also: list[str]) -> None:
    """The watcher: wait for the run to end; if it ended without a word, clean after it."""
    # A line, not the whole stream: a process forked from the run may still hold the pipe.
    if sys.stdin.buffer.readline():
        return  # the run finished and dealt with its directory itself
    for other in also:
        remove(other)
    if keep:
        print(kept_line(path), file=sys.stderr)
    else:
        remove(path)


if __name__ == "__main__":
    _watch(sys.argv[1] == "1", sys.argv[2], sys.argv[3:])
