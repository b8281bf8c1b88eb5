"""``check --races``: a one-minute proof, on the GPU in hand, that the plugin's read races alike.

Twelve real races (:mod:`._race_set`) run through b12x's own
``prepare_race_steps`` and ``measure_race_steps`` under b12x's own
``no_compilation()`` guard, three ways each repeat, in rotating order: stock
b12x (its buffer), the plugin (inside :func:`flare_l2evict.evicting_from`,
the program path of the same decision and installation as the hook, reading
a resident tensor of the window's size), and stock again. Stock's re-run is
the yardstick: races are timings, and a near-tie may flip between two stock
runs. The plugin agrees when it changes no more winners than the re-run does.

A winner "changes" only where the arm's winner costs more than
:data:`TOLERANCE` above stock's winner under stock's own timings of that
repeat (a tie within noise is no change). Each arm's race memory peak is the
CUDA allocator's peak growth over its races: stock allocates its buffer per
race, the plugin nothing.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, computed_field, field_serializer

from .._errors import L2EvictError
from .._settings import L2EvictSettings
from .._text import shown

if TYPE_CHECKING:
    import torch

ARMS = ("stock", "plugin", "stock_rerun")
REPEATS = 2
TOLERANCE = 0.01
"""A winner that costs at most 1% more than stock's under stock's timings is a tie, not a change."""


class RaceAgreement(BaseModel):
    """``check --races``: real b12x races, stock against the plugin, on this GPU.

    Filled as the races run (:func:`race_check`); ``agrees`` decides the exit code. What
    ``check --json`` prints as ``races``, declared once.
    """

    model_config = ConfigDict(extra="forbid")

    races: NonNegativeInt = Field(description="Races per repeat.")
    repeats: NonNegativeInt = Field(description="Repeats of the race set.")
    winners: dict[str, list[list[int]]] = Field(
        default_factory=dict,
        description="Per arm (stock, plugin, stock_rerun), per repeat, each race's winner.",
    )
    changed: dict[str, NonNegativeInt] = Field(
        default_factory=dict,
        description="Per arm but stock, races whose winner changed beyond the tolerance.",
    )
    max_regret: dict[str, float] = Field(
        default_factory=dict,
        description="Per arm, the worst cost of its winner over stock's, under stock's timings.",
    )
    peak_bytes: dict[str, NonNegativeInt] = Field(
        default_factory=dict,
        description="Per arm, the CUDA allocator's peak growth over its races.",
    )
    winner_latency_ratio: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="Per arm, its winner's latency over stock's winner's: lowest, highest.",
    )
    reclaimed_bytes: NonNegativeInt = Field(
        default=0, description="What the plugin's arm reclaimed."
    )
    reason: str | None = Field(
        default=None, description="Why the plugin's arm did not run, or null."
    )
    seconds: float = Field(default=0.0, description="Seconds the races took.")
    cute_guard_stand_in: bool = Field(
        default=False,
        description="b12x's no-compilation guard ran with a stand-in for the CuTe DSL's compiler.",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="The plugin changed no more winners than stock's re-run."
    )
    @property
    def agrees(self) -> bool:
        if self.reason is not None:
            return False
        return self.changed.get("plugin", 0) <= self.changed.get("stock_rerun", 0)

    @computed_field(  # type: ignore[prop-decorator]
        description="A winner costing at most this much more is a tie."
    )
    @property
    def tolerance(self) -> float:
        return TOLERANCE

    @field_serializer("seconds")
    def _seconds(self, seconds: float) -> float:
        return round(seconds, 2)


def _winner(latencies: tuple[float, ...]) -> int:
    return min(range(len(latencies)), key=latencies.__getitem__)


def race_check(
    device: torch.device,
    settings: L2EvictSettings,
    line: Callable[..., None],
) -> RaceAgreement:
    """Run the race set on ``device`` (CUDA) three ways; ``line`` prints each report line.

    Raises :class:`~flare_l2evict.L2EvictError` (one line) where the races
    cannot run at all: no Triton, or no b12x race machinery.
    """
    import torch

    try:
        importlib.import_module("triton")
    except ImportError as error:
        raise L2EvictError(
            f"--races needs Triton to build its race set ({shown(str(error), 120)}); "
            "fix: pip install triton (torch's CUDA wheels bring it)"
        ) from None
    from .._program import evicting_from
    from ._race_set import SHAPES, gemm_race
    from .reference_host import cute_guard, run_race

    began = time.perf_counter()
    result = RaceAgreement(races=len(SHAPES), repeats=REPEATS)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    window = settings.window_bytes(l2)
    # The resident tensor the plugin's arm reads: one storage of the window's size.
    # Held here as well as in the mapping: resident memory the program keeps, as a server's
    # weights are, not memory only the block would keep alive.
    weights = torch.zeros(window // 2, dtype=torch.bfloat16, device=device)
    resident = {"check_races.weights": weights}
    latencies: dict[str, list[list[tuple[float, ...]]]] = {arm: [] for arm in ARMS}
    try:
        races = [gemm_race(m, n, k, device) for m, n, k in SHAPES]
    except Exception as error:  # Triton that cannot build this kernel on this GPU
        raise L2EvictError(
            f"--races could not build its Triton race set on {device} "
            f"({type(error).__name__}: {shown(str(error), 200)}); fix: run check without --races"
        ) from None
    try:
        with cute_guard() as stand_in:
            result.cute_guard_stand_in = stand_in
            for repeat in range(REPEATS):
                order = ARMS[repeat % len(ARMS) :] + ARMS[: repeat % len(ARMS)]
                for arm in order:
                    if arm == "plugin":
                        with evicting_from(
                            resident, race_jobs=1, device=device, window=settings.window
                        ) as report:
                            result.reclaimed_bytes = report.reclaimed_bytes
                            if report.reclaimed_bytes == 0:
                                result.reason = report.reason or "the plugin fell back"
                                break
                            # Inside the block: the start-up's one measurement of stock's
                            # buffer is behind us, so the peak is the races' own.
                            seen, peak = _races(races, device, run_race)
                    else:
                        seen, peak = _races(races, device, run_race)
                    result.peak_bytes[arm] = max(result.peak_bytes.get(arm, 0), peak)
                    latencies[arm].append(seen)
                if result.reason is not None:
                    break
    except ImportError as error:  # b12x without the race machinery the plugin knows
        raise L2EvictError(
            f"--races needs b12x's race machinery ({shown(str(error), 200)}); fix: pip install "
            "'flashinfer-python>=0.7.2' (or b12x>=1.5)"
        ) from None
    except Exception as error:  # b12x's own refusal inside a race (its guard, a launch)
        raise L2EvictError(
            f"--races: a race raised {type(error).__name__} ({shown(str(error), 300)}); "
            "fix: run check without --races, and report this line"
        ) from None
    finally:
        del races, resident, weights
        torch.cuda.empty_cache()
    result.seconds = time.perf_counter() - began
    if result.reason is None:
        _judge(result, latencies)
    _lines(result, line)
    return result


def _races(
    races: list[Any], device: torch.device, run_race: Callable[..., Any]
) -> tuple[list[tuple[float, ...]], int]:
    """Each race's latencies, and the CUDA allocator's peak growth over them (bytes)."""
    import torch

    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    seen = [run_race(calls, device, None).latencies_us for calls in races]
    torch.cuda.synchronize(device)
    return seen, torch.cuda.max_memory_allocated(device) - base


def _judge(result: RaceAgreement, latencies: dict[str, list[list[tuple[float, ...]]]]) -> None:
    """Winners, changes beyond the tolerance, regret and spread against stock's first arm."""
    for arm in ARMS:
        result.winners[arm] = [[_winner(race) for race in repeat] for repeat in latencies[arm]]
    for arm in ARMS[1:]:
        changed, regrets, ratios = 0, [], []
        for base_repeat, arm_repeat in zip(latencies["stock"], latencies[arm], strict=True):
            for base, seen in zip(base_repeat, arm_repeat, strict=True):
                chosen = _winner(seen)
                regret = base[chosen] / min(base) - 1
                regrets.append(regret)
                changed += chosen != _winner(base) and regret > TOLERANCE
                ratios.append(min(seen) / min(base))
        result.changed[arm] = changed
        result.max_regret[arm] = max(regrets)
        result.winner_latency_ratio[arm] = (min(ratios), max(ratios))


def _lines(result: RaceAgreement, line: Callable[..., None]) -> None:
    guard = (
        "b12x's no_compilation() with b12x._lib.compiler stood in (no CuTe DSL)"
        if result.cute_guard_stand_in
        else "b12x's own no_compilation()"
    )
    line(
        f"races: {result.races} real b12x races x {result.repeats} repeats, stock / plugin / "
        f"stock re-run ({result.seconds:.1f} s)",
        f"Triton decode GEMMs, 3 candidates each, through b12x's prepare_race_steps and "
        f"measure_race_steps under {guard}",
    )
    if result.reason is not None:
        line("races: verdict: not compared, the plugin fell back", shown(result.reason, 600))
        return
    total = result.races * result.repeats
    for arm, name in (("plugin", "plugin"), ("stock_rerun", "stock re-run")):
        same = sum(
            a == b
            for base, seen in zip(result.winners["stock"], result.winners[arm], strict=True)
            for a, b in zip(base, seen, strict=True)
        )
        low, high = result.winner_latency_ratio[arm]
        line(
            f"races: {name}: stock's winner in {same} of {total}; changed beyond "
            f"{TOLERANCE:.0%}: {result.changed[arm]}; regret max {result.max_regret[arm]:.2%}; "
            f"winner latency vs stock {low - 1:+.1%}..{high - 1:+.1%}"
        )
    peaks = ", ".join(
        f"{name} {result.peak_bytes.get(arm, 0):,}"
        for arm, name in zip(ARMS, ("stock", "plugin", "stock re-run"), strict=True)
    )
    line(f"races: memory peak (bytes): {peaks}")
    if result.agrees:
        line(
            "races: verdict: agrees with stock",
            "the plugin changed no more winners than stock's own re-run did",
        )
    else:
        line(
            "races: verdict: differs: the plugin changed more winners than stock's re-run",
            "fix: keep the plugin off on this GPU and report these lines",
        )
