"""``flare-l2evict bench``: stock b12x eviction and the plugin's, side by side on one GPU.

Sections (numbered as in BENCHMARKS.md): 1 memory per race job, 2 efficacy
curve, 3 cost against the HBM floor, 4 race agreement, 5 right-sized window,
6 hook cost (CPU), 7 start-up eviction cost. Figures only; nothing asserted.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..._eviction import WeightEviction
from ..._install import install, restore
from ..._source import SourceChoice, choose_source
from ..._window import stock_window_bytes
from ._hook_cost import first_call_times
from ._probe import Probe, ProbeTimes, compare, time_call

MiB = 1 << 20
_GIB = 1 << 30
WINDOW_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 3.0, 4.0)
PROBE_FRACTIONS = (0.125, 0.5, 0.8)


def _stock_method(nbytes: int, device: torch.device) -> Callable[[], None]:
    """Stock b12x's eviction at any size: a ones buffer summed to a 0-d float32."""
    buffer = torch.ones((nbytes + 3) // 4, dtype=torch.float32, device=device)
    out = torch.empty((), dtype=torch.float32, device=device)

    def flush() -> None:
        torch.sum(buffer, dim=0, out=out)

    return flush


def _choice_at(weights: torch.Tensor, nbytes: int) -> SourceChoice:
    return choose_source({"weights": weights}, weights.device, nbytes)


def _plugin_at(weights: torch.Tensor, nbytes: int) -> WeightEviction:
    return WeightEviction(_choice_at(weights, nbytes))


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


def _normalized(t: ProbeTimes, warm: ProbeTimes, cold: ProbeTimes) -> float:
    """Coldness: 0 = warm, 1 = cold after a 1 GiB read; trimmed means."""
    span = cold.trimmed_mean - warm.trimmed_mean
    return (t.trimmed_mean - warm.trimmed_mean) / span


def _spread(values: list[float]) -> dict[str, Any]:
    """Median and range of one figure over the repeats of this run."""
    return {
        "values": values,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "range": max(values) - min(values),
    }


def _efficacy(
    device: torch.device,
    l2: int,
    weights: torch.Tensor,
    factors: list[float],
    repetitions: int,
    rounds: int,
    repeats: int,
    log: Any,
) -> dict[str, Any]:
    """Coldness per probe and window, ``repeats`` times, interleaved (repeat-major)."""
    cold = _gib_read(device)
    probes = {fraction: Probe(int(l2 * fraction) // 4 * 4, device) for fraction in PROBE_FRACTIONS}
    evictions: dict[str, Callable[[], None]] = {}
    for factor in factors:
        nbytes = int(l2 * factor) // 4 * 4
        evictions[f"stock@{factor}"] = _stock_method(nbytes, device)
        evictions[f"plugin@{factor}"] = _plugin_at(weights, nbytes)
    seen: dict[str, dict[str, list[float]]] = {str(f): {} for f in PROBE_FRACTIONS}
    probe_us: dict[str, dict[str, list[float]]] = {
        str(f): {"warm": [], "cold": []} for f in PROBE_FRACTIONS
    }
    for repeat in range(repeats):
        for fraction, probe in probes.items():
            conditions: dict[str, Callable[[], None]] = {"warm": probe, "cold": cold, **evictions}
            times = compare(
                conditions, probe, repetitions=repetitions, rounds=rounds, device=device
            )
            warm, hot = times["warm"], times["cold"]
            probe_us[str(fraction)]["warm"].append(warm.trimmed_mean)
            probe_us[str(fraction)]["cold"].append(hot.trimmed_mean)
            for name in evictions:
                seen[str(fraction)].setdefault(name, []).append(_normalized(times[name], warm, hot))
        log(f"efficacy repeat {repeat + 1}/{repeats} done")
    curves: dict[str, Any] = {}
    for fraction in PROBE_FRACTIONS:
        rows = {}
        for factor in factors:
            stock = _spread(seen[str(fraction)][f"stock@{factor}"])
            plugin = _spread(seen[str(fraction)][f"plugin@{factor}"])
            spread = max(stock["range"], plugin["range"])
            rows[str(factor)] = {
                "stock": stock,
                "plugin": plugin,
                "spread": spread,
                # Colder than stock is fine: the question is only whether it is less cold.
                "within_spread": plugin["median"] >= stock["median"] - spread,
            }
        curves[str(fraction)] = {
            "probe_bytes": probes[fraction].nbytes,
            "warm_us": _spread(probe_us[str(fraction)]["warm"]),
            "cold_us": _spread(probe_us[str(fraction)]["cold"]),
            "windows": rows,
        }
    del evictions
    torch.cuda.empty_cache()
    return curves


def _calibrated_factor(
    curves: dict[str, Any], factors: list[float], default: float
) -> float | None:
    """Smallest window as cold as stock's default, within the spread, for every probe."""
    for factor in factors:
        if all(
            c["windows"][str(factor)]["plugin"]["median"]
            >= c["windows"][str(default)]["stock"]["median"]
            - max(c["windows"][str(factor)]["spread"], c["windows"][str(default)]["spread"])
            for c in curves.values()
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
    from ..reference_host import cute_guard, run_race
    from ._triton_gemm import SHAPES, gemm_race

    calls_seen = [0]

    def no_eviction() -> None:
        calls_seen[0] += 1

    rows: list[dict[str, Any]] = []
    with cute_guard() as stand_in:
        for m, n, k in SHAPES[:count]:
            calls = gemm_race(m, n, k, device)
            repeats_seen: list[dict[str, tuple[float, ...]]] = []
            for repeat in range(repeats):
                order = WAYS[repeat % len(WAYS) :] + WAYS[: repeat % len(WAYS)]
                latencies: dict[str, tuple[float, ...]] = {}
                for way in order:
                    if way == "plugin":
                        install(_choice_at(weights, window))
                    try:
                        eviction = no_eviction if way == "none" else None  # None: b12x's lookup
                        latencies[way] = run_race(calls, device, eviction).latencies_us
                    finally:
                        restore()
                repeats_seen.append(latencies)
            rows.append({"shape": [m, n, k], "repeats": repeats_seen})
            winners = [",".join(f"{w}={_winner(r[w])}" for w in WAYS) for r in repeats_seen]
            log(f"race {m}x{n}x{k}: winners " + " | ".join(winners))
            del calls
    summary = {}
    for way in WAYS[1:]:
        agree: list[int] = []
        regrets: list[float] = []
        ratios: list[float] = []
        for repeat in range(repeats):
            agreed = 0
            for row in rows:
                seen = row["repeats"][repeat]
                base = seen["stock_a"]
                chosen = _winner(seen[way])
                agreed += chosen == _winner(base)
                regrets.append(base[chosen] / min(base) - 1)
                # What eviction is for: without it the winner's latency is measured warm.
                ratios.append(min(seen[way]) / min(base))
            agree.append(agreed)
        summary[way] = {
            "agree_with_stock_per_repeat": agree,
            "mean_regret": statistics.fmean(regrets),
            "max_regret": max(regrets),
            "mean_best_latency_ratio": statistics.fmean(ratios),
            "min_best_latency_ratio": min(ratios),
        }
    return {
        "races": rows,
        "summary": summary,
        "repeats": repeats,
        "evictions_per_session": calls_seen[0] // repeats,
        "cute_guard_stand_in": stand_in,
    }


def _winner(latencies: tuple[float, ...]) -> int:
    return min(range(len(latencies)), key=latencies.__getitem__)


def _cost(device: torch.device, weights: torch.Tensor, window: int, repeats: int) -> dict[str, Any]:
    """Time per eviction at the stock window against the HBM floor, ``repeats`` times."""
    read = _gib_read(device)
    plugin = _plugin_at(weights, window)
    methods: dict[str, Callable[[], None]] = {
        "stock": _stock_method(window, device),
        "plugin": plugin,
        "plugin_torch": WeightEviction(_choice_at(weights, window), kernel="torch"),
        # 1 MiB stays in L2: what one launch costs to start and drain, whatever it reads.
        "plugin_1mib": _plugin_at(weights, MiB),
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
    del methods
    torch.cuda.empty_cache()
    return {
        "plugin_kernel": plugin.kernel,
        "hbm_read_bytes_per_s": statistics.median(bandwidths),
        "us": {name: _spread(values) for name, values in figures.items()},
        "over_floor": over,
    }


def run_bench(
    device: torch.device,
    out_dir: Path,
    *,
    repetitions: int = 240,
    rounds: int = 6,
    races: int = 36,
    repeats: int = 3,
    log: Any = print,
) -> dict[str, Any]:
    """Run every section; write ``bench.json`` (and ``efficacy.png`` with matplotlib)."""
    measurement = importlib.import_module("b12x.preparation._measurement")
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
    }
    log(f"bench on {properties.name}: L2 {l2 / MiB:.0f} MiB, stock window {window / MiB:.0f} MiB")

    # 1. Memory per race job, through b12x's own function with and without the plugin.
    result["memory"] = {
        "stock": _allocated(lambda: measurement._l2_flush_fn(device, enabled=True), device)
    }
    install(_choice_at(weights, window))
    try:
        result["memory"]["plugin"] = _allocated(
            lambda: measurement._l2_flush_fn(device, enabled=True), device
        )
    finally:
        restore()

    # 3. Cost at the default window against the HBM read floor measured here.
    result["cost"] = _cost(device, weights, window, repeats)
    log("cost done")

    # 2 and 5. Efficacy curves; the smallest window that evicts as well as stock.
    default = round(window / l2, 4)
    factors = sorted({*WINDOW_FACTORS, default})
    curves = _efficacy(device, l2, weights, factors, repetitions, rounds, repeats, log)
    result["efficacy"] = curves
    result["default_factor"] = default
    factor = _calibrated_factor(curves, factors, default)
    result["calibrated"] = {
        "factor": factor,
        "window_bytes": None if factor is None else int(l2 * factor) // 4 * 4,
    }

    # 4. Race agreement: stock, plugin, no eviction, stock again; repeated, rotated.
    result["races"] = _races(device, weights, window, races, repeats, log)

    # 7. Start-up cost: evictions of one race session times each's per-call time.
    calls = result["races"]["evictions_per_session"]
    us = result["cost"]["us"]
    result["startup_cost_ms"] = {
        "evictions": calls,
        "stock": calls * us["stock"]["median"] / 1e3,
        "plugin": calls * us["plugin"]["median"] / 1e3,
    }

    # 6. Hook cost on the CPU: first call in fresh processes, and warm.
    result["hook_cost"] = first_call_times()

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(result, indent=2, default=str))
    result["plot"] = _plot(curves, l2, default, out_dir / "efficacy.png")
    return result


def _gib_read(device: torch.device) -> Callable[[], None]:
    """A read of 1 GiB of unrelated memory, reduced row-wise as the plugin reads."""
    unrelated = torch.ones(_GIB // 4, dtype=torch.float32, device=device)
    sink = torch.empty(8192, dtype=torch.float32, device=device)

    def read() -> None:
        torch.sum(unrelated.view(8192, -1), dim=1, out=sink)

    return read


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _plot(curves: dict[str, Any], l2: int, default: float, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for (fraction, curve), color in zip(curves.items(), ("C0", "C1", "C2"), strict=False):
        factors = [float(f) for f in curve["windows"]]
        for way, style in (("stock", "--o"), ("plugin", "-s")):
            medians = [w[way]["median"] for w in curve["windows"].values()]
            low = [w[way]["min"] for w in curve["windows"].values()]
            high = [w[way]["max"] for w in curve["windows"].values()]
            axis.plot(factors, medians, style, color=color, label=f"{way}, probe {fraction} x L2")
            axis.fill_between(factors, low, high, color=color, alpha=0.12)
    axis.axvline(default, color="grey", linewidth=0.8)
    axis.set_xlabel(f"eviction window (x L2 = {l2 / MiB:.0f} MiB); grey: stock default")
    axis.set_ylabel("probe coldness (0 warm, 1 after 1 GiB read); band: range of repeats")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return str(path)


def _shown(figure: dict[str, Any], digits: int = 3) -> str:
    return f"{figure['median']:.{digits}f} [{figure['min']:.{digits}f}-{figure['max']:.{digits}f}]"


def summary_table(result: dict[str, Any]) -> str:
    """The short table printed last: medians with [min-max] over the run's repeats."""
    mem, cost, races = result["memory"], result["cost"], result["races"]
    default = str(result["default_factor"])
    repeats = result["repeats"]
    lines = [
        f"bench: {result['gpu']}, L2 {result['l2_bytes'] / MiB:.0f} MiB, torch {result['torch']}, "
        f"b12x {result['b12x']}; figures: median [min-max] over {repeats} interleaved repeats",
        f"1 memory per race job (held/peak B): stock {mem['stock']['held_bytes']:,}/"
        f"{mem['stock']['peak_bytes']:,}  plugin {mem['plugin']['held_bytes']:,}/"
        f"{mem['plugin']['peak_bytes']:,}",
    ]
    for fraction, curve in result["efficacy"].items():
        at = curve["windows"][default]
        inside = sum(w["within_spread"] for w in curve["windows"].values())
        lines.append(
            f"2 coldness, probe {fraction} x L2, default window: stock {_shown(at['stock'])} "
            f"plugin {_shown(at['plugin'])}: "
            f"{'as cold within' if at['within_spread'] else 'LESS COLD beyond'} the spread "
            f"({at['spread']:.3f}); windows as cold: {inside}/{len(curve['windows'])}"
        )
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
        + (
            f"; one launch reading 1 MiB (start + drain) {_shown(us['plugin_1mib'], 1)} us"
            if "plugin_1mib" in us
            else ""
        )
    )
    count = len(races["races"])
    names = {"plugin": "plugin", "stock_b": "stock re-run", "none": "no eviction"}
    for way, figures in races["summary"].items():
        agree = ", ".join(str(a) for a in figures["agree_with_stock_per_repeat"])
        lines.append(
            f"4 races ({count}) {names[way]:>12}: picks stock's winner in {agree} of {count}; "
            f"regret mean {figures['mean_regret']:.2%} max {figures['max_regret']:.2%}; "
            f"winner latency vs stock mean {figures['mean_best_latency_ratio'] - 1:+.1%} "
            f"min {figures['min_best_latency_ratio'] - 1:+.1%}"
        )
    calibrated = result["calibrated"]
    if calibrated["factor"]:
        lines.append(
            f"5 smallest window as cold as stock's default (within spread): "
            f"{calibrated['factor']} x L2 = {calibrated['window_bytes']:,} B"
        )
    else:
        lines.append("5 no window of the grid is as cold as stock's default within the spread")
    for row in result["hook_cost"]:
        kind = "fused blocks" if row["largest_is_fused_views"] else "one block"
        lines.append(
            f"6 source choice (CPU) {row['tensors']:>7,} tensors ({kind}): first call "
            f"{row['first_median_ms']:.1f} ms [{min(row['first_ms']):.1f}-"
            f"{max(row['first_ms']):.1f}] in fresh processes, warm {row['warm_median_ms']:.1f} ms"
        )
    startup = result["startup_cost_ms"]
    lines.append(
        f"7 start-up eviction time over {startup['evictions']:,} evictions: "
        f"stock {startup['stock']:.1f} ms, plugin {startup['plugin']:.1f} ms"
    )
    return "\n".join(lines)
