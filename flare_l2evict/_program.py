"""The same promise for programs that are not flare hosts: :func:`evicting_from`.

A script that runs b12x's races itself (a benchmark, a vLLM fork's warm-up)
names the tensors whose memory stays resident; inside the ``with`` block the
races read those instead of allocating a buffer per race job. It is the
start-up of :mod:`._startup`, with a runtime made here: the same decision,
the same installation, the same one-line fallbacks. The report is returned
instead of being offered to a KV allocator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from . import _startup
from ._errors import ConfigError, L2EvictError
from ._lifecycle import PROCESS
from ._log import say
from ._report import ReclaimReport
from ._runtime import MAX_L2_BYTES, MAX_RACE_JOBS, whole_number
from ._settings import SECTION, settings_from_section
from ._text import described_value

if TYPE_CHECKING:
    import torch

log = logging.getLogger("flare_l2evict")


class _KeptReport:
    """The program's side of the offer: it keeps the report (there is no KV budget to grow)."""

    def __init__(self) -> None:
        self.report: ReclaimReport | None = None

    def add_reclaimed(self, report: ReclaimReport) -> None:
        self.report = report


@dataclass
class _ProgramRuntime:
    """The runtime contract filled in for a program: one process, its tensors, its race jobs."""

    device: object
    race_jobs: object
    l2_cache_bytes: object
    config: Mapping[str, Any]
    tensors: object = field(repr=False)
    kv_allocator: _KeptReport = field(default_factory=_KeptReport)
    rank: int = 0
    world_size: int = 1
    process_group: None = None

    def resident_tensors(self) -> object:
        return self.tensors


_NONE = object()


def _device_of(tensors: object) -> object:
    """The device of the first tensor (``None``: :func:`_argument_problem` names why)."""
    first = _first_value(tensors)
    try:
        return None if first is _NONE else first.device  # type: ignore[attr-defined]
    except Exception:
        return None


def _first_value(tensors: object) -> object:
    """The mapping's first value (``_NONE``: not a mapping, empty, or it raised)."""
    if not isinstance(tensors, Mapping):
        return _NONE
    try:
        return next(iter(tensors.values()), _NONE)
    except Exception:
        return _NONE


def _argument_problem(
    tensors: object, device: object, race_jobs: object, l2: object, section: dict[str, Any]
) -> str | None:
    """What is wrong with the program's arguments, in the program's words (``None``: nothing)."""
    try:
        settings_from_section(section)
    except ConfigError as error:  # the settings' own words, less the config file's
        cause = str(error).partition("; fix: ")[0].replace(f"{'.'.join(SECTION)}.", "")
        return (
            f"{cause}; nothing changed; fix: pass window=, exclude= (a list of globs) and "
            'on_error= as the README\'s "Without flare" shows'
        )
    if device is None:
        first = _first_value(tensors)
        what = (
            f"tensors is {described_value(tensors)}, not a non-empty mapping of names to tensors"
            if first is _NONE
            else f"the first value of tensors is {described_value(first, 80)}, not a tensor"
        )
        return (
            f"{what}, and no device was given; nothing changed; fix: pass {{name: tensor}} "
            "for the tensors that stay resident, or device="
        )
    jobs = whole_number(race_jobs)
    if jobs is None or not 0 <= jobs <= MAX_RACE_JOBS:
        return (
            f"race_jobs = {described_value(race_jobs, 80)}; nothing changed; fix: pass "
            "race_jobs=, how many b12x race jobs the program holds at once (a whole number "
            f"in 0..{MAX_RACE_JOBS})"
        )
    size = None if l2 is None else whole_number(l2)
    if l2 is not None and (size is None or not 0 < size <= MAX_L2_BYTES):
        return (
            f"l2_cache_bytes = {described_value(l2, 80)}; nothing changed; fix: pass None "
            f"(read from the CUDA device) or the L2 size in bytes (1..{MAX_L2_BYTES:,})"
        )
    return None


def _refused(problem: str, on_error: object) -> ReclaimReport:
    """0 bytes and one line for arguments :func:`_argument_problem` refused."""
    reason = f"evicting_from: {problem}"
    if type(on_error) is str and on_error == "raise":  # a host object's == may raise
        raise L2EvictError(f"l2evict failed and on_error = 'raise': {reason}")
    report = ReclaimReport(device="unknown", reclaimed_bytes=0, mechanism="none", reason=reason)
    say(log, logging.WARNING, "flare_l2evict: stock b12x eviction kept; %s", report.summary())
    return report


@contextmanager
def evicting_from(
    tensors: Mapping[str, torch.Tensor],
    *,
    race_jobs: int,
    device: torch.device | str | None = None,
    l2_cache_bytes: int | None = None,
    window: int | str = "stock",
    exclude: Sequence[str] = (),
    on_error: Literal["fallback", "raise"] = "fallback",
) -> Iterator[ReclaimReport]:
    """Inside the block, b12x's races evict L2 by reading ``tensors``; yields the report.

    ``tensors`` maps names to tensors that stay resident (and unwritten
    while races run) for the whole block. ``race_jobs`` is how many b12x race
    jobs the program holds at once (one stock buffer each); ``device`` defaults
    to the first tensor's; ``l2_cache_bytes`` ``None`` reads the CUDA
    device's. ``window``, ``exclude`` and ``on_error`` are the plugin's
    settings of the same names.

    Invariants: the report's ``reclaimed_bytes`` is what the block's races
    will not allocate (0, with the reason, when it falls back: then stock
    b12x runs unchanged); on exit, exceptions included, stock b12x is back
    and nothing references the tensors. Under ``on_error = "fallback"`` it
    never raises on entry. While another start-up (a flare host's, or another
    block) is active in the process, it reports 0 and changes nothing.
    """
    section: dict[str, Any] = {"window": window, "exclude": exclude, "on_error": on_error}
    runtime = _ProgramRuntime(
        device=_device_of(tensors) if device is None else device,
        race_jobs=race_jobs,
        l2_cache_bytes=l2_cache_bytes,
        config={"plugins": {"l2evict": section}},
        tensors=tensors,
    )
    problem = _argument_problem(tensors, runtime.device, race_jobs, l2_cache_bytes, section)
    if problem is not None:  # said in the program's words, not the host contract's
        yield _refused(problem, on_error)
        return
    try:
        report = _startup.run(runtime)
        yield report
    finally:
        if PROCESS.belongs_to(runtime):  # a refused block ends nobody else's start-up
            _startup.finish(runtime)
        runtime.tensors = None
