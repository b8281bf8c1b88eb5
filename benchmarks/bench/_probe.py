"""Time an L2-resident probe after an eviction, with the GPU kept busy while the host queues.

A probe of a few microseconds is smaller than a kernel launch's host cost, so
each batch starts with ``torch.cuda._sleep``: the host queues every
(prepare, [between], start, probe, end) sequence while the GPU sleeps, and the
GPU then runs them back to back. Events bracket the probe alone.

``between`` is what makes conditions comparable: the same small kernel (see
:func:`spacer`) runs after every condition and before the probe, so the probe
never directly follows a kernel of the condition's own kind. Without it the
probe's time also moves with the kernel that ran just before it (its code and
tail), and not only with what L2 holds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

_BATCH = 16
# ~3 ms at H100/H200 clocks: several times what queueing a batch takes on the host
# (16 x four launches), so the GPU never waits for the host inside a batch.
_SLEEP_CYCLES = 6_000_000
_SPACER_CYCLES = 2_000  # ~1 us: long enough for the previous kernel to have drained


@dataclass(frozen=True)
class ProbeTimes:
    """Probe latencies in microseconds for one condition."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def trimmed_mean(self) -> float:
        """Mean of the middle 80%: below the event timer's ~32 ns step, unlike the median."""
        ordered = sorted(self.samples)
        cut = len(ordered) // 10
        return statistics.fmean(ordered[cut : len(ordered) - cut] or ordered)

    @property
    def stderr(self) -> float:
        """Standard error of :attr:`trimmed_mean` (of the middle 80%, conservatively)."""
        ordered = sorted(self.samples)
        cut = len(ordered) // 10
        middle = ordered[cut : len(ordered) - cut] or ordered
        if len(middle) < 2:
            return float("inf")
        return float(statistics.stdev(middle) / len(middle) ** 0.5)

    @property
    def spread(self) -> float:
        """Half the interquartile range: the noise figure of this condition."""
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / 2


class Probe:
    """Sums a buffer of ``nbytes`` (sized to fit in L2) into a preallocated scalar."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        self.out = torch.empty((), dtype=torch.float32, device=device)
        self.nbytes = nbytes

    def __call__(self) -> None:
        torch.sum(self.buffer, dim=0, out=self.out)


def spacer() -> None:
    """One tiny kernel that touches no memory (a single thread spinning ~1 us)."""
    torch.cuda._sleep(_SPACER_CYCLES)  # type: ignore[no-untyped-call]


def time_after(
    prepare: Callable[[], None],
    probe: Callable[[], None],
    *,
    repetitions: int,
    device: torch.device,
    between: Callable[[], None] | None = None,
) -> ProbeTimes:
    """The probe's time right after ``prepare`` (then ``between``), ``repetitions`` times."""
    stream = torch.cuda.current_stream(device)
    samples: list[float] = []
    probe()  # first-touch and launch caches out of the way
    torch.cuda.synchronize(device)
    while len(samples) < repetitions:
        count = min(_BATCH, repetitions - len(samples))
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
            for _ in range(count)
        ]
        torch.cuda._sleep(_SLEEP_CYCLES)  # type: ignore[no-untyped-call]
        for start, end in events:
            prepare()
            if between is not None:
                between()
            start.record(stream)
            probe()
            end.record(stream)
        torch.cuda.synchronize(device)
        samples.extend(start.elapsed_time(end) * 1000.0 for start, end in events)
    return ProbeTimes(tuple(samples))


def time_call(call: Callable[[], None], *, repetitions: int, device: torch.device) -> ProbeTimes:
    """The time of ``call`` itself (e.g. one eviction), GPU kept busy the same way."""
    return time_after(_nothing, call, repetitions=repetitions, device=device)


def _nothing() -> None:
    """No preparation."""


def compare(
    conditions: dict[str, Callable[[], None]],
    probe: Callable[[], None],
    *,
    repetitions: int,
    rounds: int,
    device: torch.device,
    between: Callable[[], None] | None = None,
) -> dict[str, ProbeTimes]:
    """The probe after each condition, interleaved over ``rounds`` to share any drift.

    The order of the conditions rotates from round to round, so none is always
    first after a synchronisation or always after the same neighbour.
    """
    samples: dict[str, list[float]] = {name: [] for name in conditions}
    per_round = max(1, repetitions // rounds)
    names = list(conditions)
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            timed = time_after(
                conditions[name], probe, repetitions=per_round, device=device, between=between
            )
            samples[name].extend(timed.samples)
    return {name: ProbeTimes(tuple(values)) for name, values in samples.items()}
