"""What this machine's memory can hold: the reference host asks before it loads on the CPU.

On the CPU the reference host copies every tensor out of the checkpoint's
mapped file, so while a file is copied both its mapping and the copy are
resident: a run holds the whole checkpoint plus its largest file at its peak
(the embedded example at ``--l2-mib 4096`` is a 9.0 GiB file, so about 18 GiB).
Torch-free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from .._errors import CheckpointError
from ._profiles import GiB

MEMINFO = Path("/proc/meminfo")
FALLBACK_BYTES = 16 * GiB
"""Assumed available where neither /proc/meminfo nor ``os.sysconf`` says: a mid-size machine."""

_MEMINFO_LIMIT = 64 * 1024  # the real file is about 1.5 KB; a larger one is not /proc's
_AVAILABLE = re.compile(rb"^MemAvailable:\s+([0-9]{1,15}) kB$", re.MULTILINE)


def available_memory(meminfo: Path | None = None) -> tuple[int, str]:
    """Bytes this machine can give a new allocation without swapping, and where the figure is from.

    ``MemAvailable`` of ``meminfo`` (default :data:`MEMINFO`, Linux's), else
    ``os.sysconf``'s available pages, else its physical pages, else
    :data:`FALLBACK_BYTES`.
    """
    meminfo = meminfo or MEMINFO
    try:
        with meminfo.open("rb") as handle:
            found = _AVAILABLE.search(handle.read(_MEMINFO_LIMIT))
    except OSError:
        found = None
    if found is not None:
        return int(found.group(1)) * 1024, f"MemAvailable in {meminfo}"
    for pages, what in (("SC_AVPHYS_PAGES", "available"), ("SC_PHYS_PAGES", "physical")):
        try:
            count, size = os.sysconf(pages), os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            continue
        if count > 0 and size > 0:
            return count * size, f"os.sysconf's {what} pages"
    return FALLBACK_BYTES, f"nothing here says, so a fixed {FALLBACK_BYTES // GiB} GiB"


def cpu_load_bytes(files: Sequence[Path]) -> int:
    """Peak bytes a CPU load of ``files`` holds: every file copied, plus the largest one mapped."""
    sizes = {}
    for path in files:
        try:
            sizes[os.path.realpath(path)] = os.stat(path).st_size
        except (OSError, ValueError):  # left to the loader's own one-line error
            continue
    return sum(sizes.values()) + max(sizes.values(), default=0)


def refuse_what_this_machine_cannot_hold(
    files: Sequence[Path], meminfo: Path | None = None
) -> None:
    """Raise one line when loading ``files`` on the CPU would need more memory than is available.

    Only file sizes are read, so a checkpoint of any declared size is refused
    without allocating a byte of it.
    """
    need = cpu_load_bytes(files)
    available, source = available_memory(meminfo)
    if need <= available:
        return
    count = len({os.path.realpath(path) for path in files})
    raise CheckpointError(
        f"loading the checkpoint on the CPU needs about {need / GiB:,.1f} GiB ({need:,} bytes: "
        f"{count:,} file{'s' if count != 1 else ''}, each tensor copied out of its mapped "
        f"file), and this machine has {available / GiB:,.1f} GiB available ({source}); fix: "
        "free memory, pass a smaller checkpoint (for the embedded example, a smaller "
        "--l2-mib), or run it on a GPU with --device cuda:N"
    )
