"""``python -m benchmarks.bench``: stock b12x eviction and the plugin's, side by side on one GPU.

Sections (numbered as in BENCHMARKS.md): 1 memory per race job, 2 coldness
(timed, and counted by Nsight Compute where it is installed; each in fresh
processes, every process reported), 3 cost against the HBM floor plus one
launch, 4 race agreement, 5 right-sized window, 6 hook cost (the source choice
on the CPU; ``before_first_capture`` and Triton's own start in fresh
processes), 7 start-up eviction cost. Figures only; nothing asserted.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from flare_l2evict._b12x.proof import measure_basis
from flare_l2evict._credit import stock_window_bytes
from flare_l2evict._eviction import Kernel, WeightEviction
from flare_l2evict._settings import L2EvictSettings
from flare_l2evict._weights import WeightChoice
from flare_l2evict.tools._choose_weights import Installed, choose_weights, install
from flare_l2evict.tools._origin import stock_row

from . import _coldness
from ._hook_cost import first_call_times, hook_lines, hook_times, triton_lines, triton_start_times
from ._probe import time_call

MiB = 1 << 20
_GIB = 1 << 30
WINDOW_FACTORS = (0.75, 1.0, 1.5)  # besides the default (2.0 x L2 on an H200)
COLDNESS_METHOD = "spacer"
"""How section 2 judges the timed probe (see :mod:`._coldness`): the same tiny
kernel between every condition and the probe. ``"plain"`` (bench 0.3.0's
method, the probe right after the condition) is measured beside it."""
COLDNESS_METHODS = (COLDNESS_METHOD, "plain")
COLDNESS_REFERENCE = "cold_1gib"
NCU_PLAN = (("dram__bytes_read.sum", 3), ("lts__t_sector_hit_rate.pct", 1))
NCU_BUDGET_S = 120.0


def _stock_method(nbytes: int, device: torch.device) -> Callable[[], None]:
    """Stock b12x's eviction at any size: a ones buffer summed to a 0-d float32."""
    buffer = torch.ones((nbytes + 3) // 4, dtype=torch.float32, device=device)
    out = torch.empty((), dtype=torch.float32, device=device)

    def flush() -> None:
        torch.sum(buffer, dim=0, out=out)

    return flush


def _choice_at(weights: torch.Tensor, nbytes: int) -> WeightChoice:
    return choose_weights({"weights": weights}, weights.device, nbytes)


def _installed(
    weights: torch.Tensor, window: int, device: torch.device, l2_bytes: int | None = None
) -> Installed:
    """The plugin installed as a start-up installs it, for a ``with`` block: races inside it
    look b12x's eviction up and get the plugin's (Triton read), stock's again after it.
    ``l2_bytes``: ``None`` reads the device's (a CPU has none to read)."""
    chosen = _choice_at(weights, window)
    settings = L2EvictSettings.model_construct(window=chosen.window_bytes)
    return install(chosen, measure_basis(device, l2_bytes, settings, 0), kernel="triton")


def _plugin_at(weights: torch.Tensor, nbytes: int, kernel: Kernel = "triton") -> WeightEviction:
    """The plugin's eviction with the read kernel named: the bench never leaves it to "auto"."""
    return WeightEviction(_choice_at(weights, nbytes), kernel=kernel)


def _allocated(make: Callable[[], Callable[[], None]], device: torch.device) -> dict[str, int]:
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    eviction = make()
    eviction()
    torch.cuda.synchronize(device)
    held = torch.cuda.memory_allocated(device) - base
    peak = torch.cuda.max_memory_allocated(device) - base
    del eviction
    return {"held_bytes": held, "peak_bytes": peak}


def _spread(values: list[float]) -> dict[str, Any]:
    """Median and range of one figure over the repeats of this run."""
    return {
        "values": values,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "range": max(values) - min(values),
    }


def _coldness_section(
    out_dir: Path,
    *,
    processes: int,
    repeats: int,
    repetitions: int,
    rounds: int,
    log: Any,
) -> dict[str, Any]:
    """Section 2: coldness in ``processes`` fresh processes, timed; then counted by ncu.

    Every process is kept and judged on its own: stock, the plugin's Triton read
    and its torch read, interleaved, at the default window (and stock and the
    Triton read at :data:`WINDOW_FACTORS` for section 5).
    """
    runs = _coldness.timed_in_processes(
        out_dir,
        processes,
        methods=COLDNESS_METHODS,
        why=True,
        grid=WINDOW_FACTORS,
        repeats=repeats,
        repetitions=repetitions,
        rounds=rounds,
        log=log,
    )
    counted: list[dict[str, Any]] = []
    if _coldness.ncu_path() is not None:
        counted = _coldness.ncu_in_processes(
            out_dir, NCU_PLAN, why=True, repeats=3, log=log, budget=NCU_BUDGET_S
        )
    return judge_coldness(runs, counted)


def judge_coldness(runs: list[dict[str, Any]], counted: list[dict[str, Any]]) -> dict[str, Any]:
    """Each timed process judged on its own (its spread is its repeats' range); ncu kept as is."""
    timed = []
    for run in runs:
        if "error" in run:
            timed.append({"error": run["error"]})
            continue
        rows = _coldness.timed_coldness(run, COLDNESS_METHOD, COLDNESS_REFERENCE)
        timed.append(
            {
                "pid": run["pid"],
                "probes": rows,
                "verdicts": {
                    fraction: {
                        kernel: _coldness.verdict(probe["stock"], probe[kernel])
                        for kernel in ("triton", "torch")
                    }
                    for fraction, probe in rows.items()
                },
            }
        )
    return {
        "method": COLDNESS_METHOD,
        "reference": COLDNESS_REFERENCE,
        "timed": timed,
        "timed_raw": runs,
        "ncu": counted,
    }


def _calibrated_factor(coldness: dict[str, Any]) -> float | None:
    """Smallest window whose Triton read is as cold as stock's default, in every process."""
    good = [t for t in coldness["timed"] if "error" not in t]
    if not good:
        return None
    for factor in sorted(WINDOW_FACTORS):
        if all(
            _coldness.verdict(probe["stock"], probe[f"triton@{factor}"])["as_cold"]
            for run in good
            for probe in run["probes"].values()
        ):
            return factor
    return None


WAYS = ("stock_a", "plugin", "none", "stock_b")


def _races(
    device: torch.device,
    weights: torch.Tensor,
    window: int,
    count: int,
    repeats: int,
    log: Any,
) -> dict[str, Any]:
    """Each race four ways, ``repeats`` times: stock, plugin, no eviction, stock again.

    The ways rotate between repeats so that drift is shared. Regret is what a
    way's winner costs under stock's timings of the same repeat.
    """
    from flare_l2evict.tools.reference_host import cute_guard, run_race

    from ._triton_gemm import SHAPES, gemm_race

    calls_seen = [0]

    def no_eviction() -> None:
        calls_seen[0] += 1

    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    with cute_guard() as stand_in:
        for m, n, k in SHAPES[:count]:
            calls = gemm_race(m, n, k, device)
            repeats_seen: list[dict[str, tuple[float, ...]]] = []
            for repeat in range(repeats):
                order = WAYS[repeat % len(WAYS) :] + WAYS[: repeat % len(WAYS)]
                latencies: dict[str, tuple[float, ...]] = {}
                for way in order:
                    with _installed(weights, window, device) if way == "plugin" else nullcontext():
                        eviction = no_eviction if way == "none" else None  # None: b12x's lookup
                        latencies[way] = run_race(calls, device, eviction).latencies_us
                repeats_seen.append(latencies)
            rows.append({"shape": [m, n, k], "repeats": repeats_seen})
            winners = [",".join(f"{w}={_winner(r[w])}" for w in WAYS) for r in repeats_seen]
            log(
                f"race {len(rows)}/{count} {m}x{n}x{k} ({time.perf_counter() - began:.1f} s): "
                "winners " + " | ".join(winners)
            )
            del calls
    summary = race_summary(rows, repeats)
    return {
        "races": rows,
        "summary": summary,
        "repeats": repeats,
        "evictions_per_session": calls_seen[0] // repeats,
        "cute_guard_stand_in": stand_in,
    }


def race_summary(rows: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Per way against ``stock_a``: winners agreed and regret, for every repeat and overall.

    Regret is what a way's winner costs under stock's timings of the same repeat.
    """
    summary: dict[str, Any] = {}
    for way in WAYS[1:]:
        agree: list[int] = []
        regrets: list[float] = []
        ratios: list[float] = []
        per_repeat: list[list[float]] = []
        for repeat in range(repeats):
            agreed = 0
            these: list[float] = []
            for row in rows:
                seen = row["repeats"][repeat]
                base = seen["stock_a"]
                chosen = _winner(seen[way])
                agreed += chosen == _winner(base)
                these.append(base[chosen] / min(base) - 1)
                # What eviction is for: without it the winner's latency is measured warm.
                ratios.append(min(seen[way]) / min(base))
            agree.append(agreed)
            regrets += these
            per_repeat.append(these)
        summary[way] = {
            "agree_with_stock_per_repeat": agree,
            "mean_regret_per_repeat": [statistics.fmean(r) for r in per_repeat],
            "max_regret_per_repeat": [max(r) for r in per_repeat],
            "mean_regret": statistics.fmean(regrets),
            "max_regret": max(regrets),
            "mean_best_latency_ratio": statistics.fmean(ratios),
            "min_best_latency_ratio": min(ratios),
        }
    return summary


def _winner(latencies: tuple[float, ...]) -> int:
    return min(range(len(latencies)), key=latencies.__getitem__)


def _cost(device: torch.device, weights: torch.Tensor, window: int, repeats: int) -> dict[str, Any]:
    """Time per eviction at the stock window against its physical limit, ``repeats`` times.

    The limit is the HBM floor (the window at the 1 GiB read's bandwidth, both
    measured here) plus what one launch of the same kernel costs to start and
    drain (measured over 1 MiB, which stays in L2 and so takes no HBM time).
    """
    read = _coldness.gib_rows(device)
    methods: dict[str, Callable[[], None]] = {
        "stock": _stock_method(window, device),
        "plugin": _plugin_at(weights, window, "triton"),
        "plugin_torch": _plugin_at(weights, window, "torch"),
        # 1 MiB stays in L2: what one launch costs to start and drain, whatever it reads.
        "plugin_1mib": _plugin_at(weights, MiB, "triton"),
        "plugin_torch_1mib": _plugin_at(weights, MiB, "torch"),
        "stock_1mib": _stock_method(MiB, device),
    }
    figures: dict[str, list[float]] = {name: [] for name in ("floor", *methods)}
    bandwidths = []
    for _ in range(repeats):
        bandwidth = _GIB / (time_call(read, repetitions=64, device=device).median * 1e-6)
        bandwidths.append(bandwidth)
        figures["floor"].append(window / bandwidth * 1e6)
        for name, method in methods.items():
            figures[name].append(time_call(method, repetitions=128, device=device).median)
    over = {
        name: _spread([t / f for t, f in zip(figures[name], figures["floor"], strict=True)])
        for name in ("stock", "plugin", "plugin_torch")
    }
    # Each way against the floor plus one launch of its own kernel, repeat by repeat.
    limits = {"stock": "stock_1mib", "plugin": "plugin_1mib", "plugin_torch": "plugin_torch_1mib"}
    over_limit = {}
    for name, launch in limits.items():
        limit = [f + one for f, one in zip(figures["floor"], figures[launch], strict=True)]
        excess = [t - lim for t, lim in zip(figures[name], limit, strict=True)]
        over_limit[name] = {
            "limit_us": _spread(limit),
            "excess_us": _spread(excess),
            "under": max(excess) <= 0,
        }
    del methods
    torch.cuda.empty_cache()
    return {
        "plugin_kernel": "triton",
        "hbm_read_bytes_per_s": statistics.median(bandwidths),
        "us": {name: _spread(values) for name, values in figures.items()},
        "over_floor": over,
        "over_floor_plus_launch": over_limit,
    }


SECTIONS = ("memory", "cost", "coldness", "races", "hook")
"""What ``--only`` picks from; BENCHMARKS.md numbers them 1, 3, 2 and 5, 4 and 7, 6."""


def run_bench(
    device: torch.device,
    out_dir: Path,
    *,
    repetitions: int = 240,
    rounds: int = 4,
    races: int = 36,
    repeats: int = 3,
    sections: frozenset[str] = frozenset(SECTIONS),
    log: Any = print,
) -> dict[str, Any]:
    """Run ``sections`` (default all); write ``bench.json`` (and ``efficacy.png`` with matplotlib).

    Each section's wall time is logged when it ends and kept in ``seconds``,
    so a later run can be sized from this one's log.
    """
    unknown = sections - set(SECTIONS)
    if unknown or not sections:
        raise ValueError(f"bench sections {sorted(unknown)}: pick from {', '.join(SECTIONS)}")
    row = stock_row()

    def seam_call() -> Callable[[], None]:  # looked up per call: after install(), the plugin's
        made: Callable[[], None] = getattr(importlib.import_module(row.module_path), row.function)(
            device, enabled=True
        )
        return made

    properties = torch.cuda.get_device_properties(device)
    l2 = int(properties.L2_cache_size)
    window = stock_window_bytes(l2)
    weights = torch.ones(max(8 * l2, 512 * MiB) // 4, dtype=torch.float32, device=device)
    result: dict[str, Any] = {
        "gpu": properties.name,
        "l2_bytes": l2,
        "torch": torch.__version__,
        "b12x": importlib.metadata.version("b12x") if _has_dist("b12x") else "bundled",
        "stock_window_bytes": window,
        "repeats": repeats,
        "sections": [name for name in SECTIONS if name in sections],
        "seconds": {},
    }
    log(
        f"bench on {properties.name}: L2 {l2 / MiB:.0f} MiB, stock window {window / MiB:.0f} MiB; "
        f"sections {', '.join(result['sections'])}"
    )
    began = time.perf_counter()

    def done(name: str, started: float) -> None:
        result["seconds"][name] = round(time.perf_counter() - started, 1)
        # Written after every section, so a run stopped by a time limit keeps what it measured.
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench.json").write_text(json.dumps(result, indent=2, default=str))
        log(
            f"{name} done in {result['seconds'][name]:.1f} s "
            f"({time.perf_counter() - began:.1f} s since the bench began)"
        )

    # 1. Memory per race job, through b12x's own function with and without the plugin.
    if "memory" in sections:
        started = time.perf_counter()
        result["memory"] = {"stock": _allocated(seam_call, device)}
        with _installed(weights, window, device):
            result["memory"]["plugin"] = _allocated(seam_call, device)
        done("memory", started)

    # 3. Cost at the default window against the HBM read floor measured here.
    if "cost" in sections:
        started = time.perf_counter()
        result["cost"] = _cost(device, weights, window, repeats)
        done("cost", started)

    # 2 and 5. Coldness in fresh processes (timed, then counted by ncu); right-sized window.
    if "coldness" in sections:
        started = time.perf_counter()
        result["coldness"] = _coldness_section(
            out_dir, processes=max(3, repeats), repeats=repeats, repetitions=repetitions,
            rounds=rounds, log=log,
        )  # fmt: skip
        factor = _calibrated_factor(result["coldness"])
        result["calibrated"] = {
            "factor": factor,
            "window_bytes": None if factor is None else int(l2 * factor) // 4 * 4,
        }
        done("coldness", started)

    # 4. Race agreement: stock, plugin, no eviction, stock again; repeated, rotated.
    if "races" in sections:
        started = time.perf_counter()
        result["races"] = _races(device, weights, window, races, repeats, log)
        done("races", started)

    # 7. Start-up cost: evictions of one race session times each's per-call time.
    if "races" in result and "cost" in result:
        calls = result["races"]["evictions_per_session"]
        us = result["cost"]["us"]
        result["startup_cost_ms"] = {
            "evictions": calls,
            "stock": calls * us["stock"]["median"] / 1e3,
            "plugin": calls * us["plugin"]["median"] / 1e3,
        }

    # 6. Hook cost: the source choice (CPU), then the whole hook and Triton's own start,
    # each in fresh processes.
    if "hook" in sections:
        started = time.perf_counter()
        result["hook_cost"] = first_call_times(processes=max(3, repeats))
        ordinal = device.index if device.index is not None else torch.cuda.current_device()
        result["hook_times"] = hook_times(f"cuda:{ordinal}", samples=max(3, repeats), log=log)
        result["triton_start"] = triton_start_times(samples=max(3, repeats), log=log)
        done("hook", started)

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(result, indent=2, default=str))
    result["plot"] = (
        _plot(result["coldness"], l2, window / l2, out_dir / "efficacy.png")
        if "coldness" in result
        else None
    )
    return result


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _plot(coldness: dict[str, Any], l2: int, default: float, path: Path) -> str | None:
    """Timed coldness over window size: median of the processes' medians, band = their range."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    good = [t for t in coldness["timed"] if "error" not in t]
    if not good:
        return None
    figure, axis = plt.subplots(figsize=(7, 4.5))
    fractions = list(good[0]["probes"])
    factors = sorted({*WINDOW_FACTORS, default})
    for fraction, color in zip(fractions, ("C0", "C1", "C2"), strict=False):
        for way, style in (("stock", "--o"), ("triton", "-s")):
            per_factor = [
                [
                    run["probes"][fraction][way if f == default else f"{way}@{f}"]["median"]
                    for run in good
                ]
                for f in factors
            ]
            axis.plot(
                factors,
                [statistics.median(v) for v in per_factor],
                style,
                color=color,
                label=f"{'stock' if way == 'stock' else 'plugin (triton)'}, probe {fraction} x L2",
            )
            axis.fill_between(
                factors, [min(v) for v in per_factor], [max(v) for v in per_factor],
                color=color, alpha=0.12,
            )  # fmt: skip
    axis.axvline(default, color="grey", linewidth=0.8)
    axis.set_xlabel(f"eviction window (x L2 = {l2 / MiB:.0f} MiB); grey: stock default")
    axis.set_ylabel("probe coldness (0 warm, 1 after 1 GiB read); band: range of processes")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return str(path)


def _shown(figure: dict[str, Any], digits: int = 3) -> str:
    return f"{figure['median']:.{digits}f} [{figure['min']:.{digits}f}-{figure['max']:.{digits}f}]"


def summary_table(result: dict[str, Any]) -> str:
    """The short table printed last: medians with [min-max] over the run's repeats.

    Only the sections the run measured appear (``--only``); the races give
    each repeat's figures, not only their spread.
    """
    repeats = result["repeats"]
    lines = [
        f"bench: {result['gpu']}, L2 {result['l2_bytes'] / MiB:.0f} MiB, torch {result['torch']}, "
        f"b12x {result['b12x']}; figures: median [min-max] over {repeats} interleaved repeats"
    ]
    if "memory" in result:
        mem = result["memory"]
        lines.append(
            f"1 memory per race job (held/peak B): stock {mem['stock']['held_bytes']:,}/"
            f"{mem['stock']['peak_bytes']:,}  plugin {mem['plugin']['held_bytes']:,}/"
            f"{mem['plugin']['peak_bytes']:,}"
        )
    if "coldness" in result:
        lines += coldness_lines(result["coldness"])
    if "cost" in result:
        lines += _cost_lines(result["cost"])
    if "races" in result:
        lines += race_lines(result["races"])
    if "calibrated" in result:
        calibrated = result["calibrated"]
        if calibrated["factor"]:
            lines.append(
                f"5 smallest window as cold as stock's default (within spread): "
                f"{calibrated['factor']} x L2 = {calibrated['window_bytes']:,} B"
            )
        else:
            lines.append("5 no window of the grid is as cold as stock's default within the spread")
    for row in result.get("hook_cost", []):
        kind = "fused blocks" if row["largest_is_fused_views"] else "one block"
        lines.append(
            f"6 source choice (CPU) {row['tensors']:>7,} tensors ({kind}): first call "
            f"{row['first_median_ms']:.1f} ms [{min(row['first_ms']):.1f}-"
            f"{max(row['first_ms']):.1f}] in fresh processes, warm {row['warm_median_ms']:.1f} ms"
        )
    lines += [f"6 hook {line}" for line in hook_lines(result.get("hook_times", []))]
    lines += [f"6 {line}" for line in triton_lines(result.get("triton_start", []))]
    if "startup_cost_ms" in result:
        startup = result["startup_cost_ms"]
        lines.append(
            f"7 start-up eviction time over {startup['evictions']:,} evictions: "
            f"stock {startup['stock']:.1f} ms, plugin {startup['plugin']:.1f} ms"
        )
    if result.get("seconds"):
        lines.append(
            "wall time (s): "
            + ", ".join(f"{name} {seconds:.1f}" for name, seconds in result["seconds"].items())
        )
    return "\n".join(lines)


def race_lines(races: dict[str, Any]) -> list[str]:
    """Section 4: per way, stock's winner picked and the regret, in every repeat."""
    count = len(races["races"])
    names = {"plugin": "plugin", "stock_b": "stock re-run", "none": "no eviction"}
    lines = []
    for way, figures in races["summary"].items():
        agree = ", ".join(str(a) for a in figures["agree_with_stock_per_repeat"])
        means = figures.get("mean_regret_per_repeat")
        per_repeat = " (per repeat " + ", ".join(f"{m:.2%}" for m in means) + ")" if means else ""
        lines.append(
            f"4 races ({count}) {names[way]:>12}: picks stock's winner in {agree} of {count}; "
            f"regret mean {figures['mean_regret']:.2%}{per_repeat} max "
            f"{figures['max_regret']:.2%}; winner latency vs stock mean "
            f"{figures['mean_best_latency_ratio'] - 1:+.1%} "
            f"min {figures['min_best_latency_ratio'] - 1:+.1%}"
        )
    if "cute_guard_stand_in" in races:
        guard = (
            "b12x's no_compilation() with b12x._lib.compiler stood in (no CuTe DSL)"
            if races["cute_guard_stand_in"]
            else "b12x's no_compilation(), unchanged"
        )
        lines.append(f"4 races ran under {guard}")
    return lines


def _cost_lines(cost: dict[str, Any]) -> list[str]:
    lines = []
    us, over = cost["us"], cost["over_floor"]
    lines.append(
        f"3 eviction per sample (us): floor {_shown(us['floor'], 1)} "
        f"(HBM {cost['hbm_read_bytes_per_s'] / 1e12:.2f} TB/s); stock {_shown(us['stock'], 1)}; "
        f"plugin ({cost['plugin_kernel']}) {_shown(us['plugin'], 1)}; "
        f"plugin (torch) {_shown(us['plugin_torch'], 1)}"
    )
    lines.append(
        f"3 over floor: stock {_shown(over['stock'], 2)}, plugin {_shown(over['plugin'], 2)}, "
        f"plugin (torch) {_shown(over['plugin_torch'], 2)}"
    )
    limit = cost.get("over_floor_plus_launch", {})
    launches = {"stock": "stock_1mib", "plugin": "plugin_1mib", "plugin_torch": "plugin_torch_1mib"}
    for name, shown_name in (("plugin", "plugin (triton)"), ("plugin_torch", "plugin (torch)"),
                             ("stock", "stock")):  # fmt: skip
        if name not in limit:
            continue
        figure = limit[name]
        excess = figure["excess_us"]
        where = (
            "under it in every repeat"
            if figure["under"]
            else f"over it in {sum(e > 0 for e in excess['values'])} of "
            f"{len(excess['values'])} repeats"
        )
        lines.append(
            f"3 {shown_name}: {_shown(us[name], 1)} us against floor + one launch of its kernel "
            f"{_shown(figure['limit_us'], 1)} us (one launch over 1 MiB "
            f"{_shown(us[launches[name]], 1)} us): excess {_shown(excess, 1)} us, {where}"
        )
    return lines


def coldness_lines(coldness: dict[str, Any]) -> list[str]:
    """Section 2's lines: each process's verdict per probe (timed), then ncu's counts."""
    lines = []
    method, reference = coldness["method"], coldness["reference"]
    for index, run in enumerate(coldness["timed"], 1):
        if "error" in run:
            lines.append(f"2 coldness (timed) process {index}: {run['error'][:300]}")
            continue
        for fraction, probe in run["probes"].items():
            verdicts = run["verdicts"][fraction]
            judged = ", ".join(
                f"{k} {'as cold' if v['as_cold'] else 'LESS COLD'} ({v['difference']:+.3f}, "
                f"spread {v['spread']:.3f})"
                for k, v in verdicts.items()
            )
            lines.append(
                f"2 coldness (timed, {method}) process {index}, probe {fraction} x L2: "
                f"stock {_shown(probe['stock'])} triton {_shown(probe['triton'])} "
                f"torch {_shown(probe['torch'])}; {judged}"
            )
    held = [
        all(v["as_cold"] for f in run["verdicts"].values() for v in f.values())
        for run in coldness["timed"]
        if "error" not in run
    ]
    lines.append(
        f"2 coldness (timed; 0 warm, 1 = after {reference}): plugin as cold as stock at every "
        f"probe in {sum(held)} of {len(held)} fresh processes"
    )
    held_ncu = _coldness.ncu_held(coldness["ncu"])
    if held_ncu:
        lines.append(
            f"2 coldness (ncu; HBM bytes the probe re-reads / its size, 1 = none left in L2): "
            f"plugin as cold as stock at every probe in {sum(held_ncu)} of {len(held_ncu)} "
            f"fresh processes"
        )
    raw = [r for r in coldness.get("timed_raw", []) if "error" not in r]
    names = (*_coldness.CLAIM, *_coldness.WHY, *_coldness.REFERENCES)
    for other in COLDNESS_METHODS:
        if raw and other in raw[0]["methods"]:
            lines += [f"2 why, timed: {line}" for line in _coldness.timed_lines(raw, other, names)]
    lines += [f"2 {line}" for line in _coldness.ncu_lines(coldness["ncu"], names)]
    return lines
