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
from ._hook_cost import choice_times
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


def _normalized(t: ProbeTimes, warm: ProbeTimes, cold: ProbeTimes) -> tuple[float, float]:
    """(efficacy, its noise): 0 = warm, 1 = cold after a 1 GiB read; trimmed means."""
    span = cold.trimmed_mean - warm.trimmed_mean
    error = (t.stderr**2 + warm.stderr**2) ** 0.5
    return (t.trimmed_mean - warm.trimmed_mean) / span, error / span


def _efficacy(
    device: torch.device,
    l2: int,
    weights: torch.Tensor,
    factors: list[float],
    repetitions: int,
    rounds: int,
    log: Any,
) -> dict[str, Any]:
    cold = _gib_read(device)

    curves: dict[str, Any] = {}
    for fraction in PROBE_FRACTIONS:
        probe = Probe(int(l2 * fraction) // 4 * 4, device)
        conditions: dict[str, Callable[[], None]] = {"warm": probe, "cold": cold}
        for factor in factors:
            nbytes = int(l2 * factor) // 4 * 4
            conditions[f"stock@{factor}"] = _stock_method(nbytes, device)
            conditions[f"plugin@{factor}"] = _plugin_at(weights, nbytes)
        times = compare(conditions, probe, repetitions=repetitions, rounds=rounds, device=device)
        warm, hot = times["warm"], times["cold"]
        rows = {}
        for factor in factors:
            stock, stock_noise = _normalized(times[f"stock@{factor}"], warm, hot)
            plugin, plugin_noise = _normalized(times[f"plugin@{factor}"], warm, hot)
            rows[str(factor)] = {
                "stock": stock,
                "plugin": plugin,
                "noise": max(stock_noise, plugin_noise),
            }
        curves[str(fraction)] = {
            "probe_bytes": probe.nbytes,
            "warm_us": warm.trimmed_mean,
            "cold_us": hot.trimmed_mean,
            "windows": rows,
        }
        log(
            f"efficacy, probe {fraction} x L2: warm {warm.trimmed_mean:.2f} us, "
            f"cold {hot.trimmed_mean:.2f} us"
        )
        del conditions, times
        torch.cuda.empty_cache()
    return curves


def _calibrated_factor(
    curves: dict[str, Any], factors: list[float], default: float
) -> float | None:
    """Smallest window whose plugin efficacy is within 0.02 of stock's default, every probe."""
    for factor in factors:
        if all(
            c["windows"][str(factor)]["plugin"] >= c["windows"][str(default)]["stock"] - 0.02
            for c in curves.values()
        ):
            return factor
    return None


def _races(
    device: torch.device,
    weights: torch.Tensor,
    window: int,
    calibrated: int | None,
    count: int,
    log: Any,
) -> dict[str, Any]:
    from ..reference_host._races import cute_guard, run_race
    from ._triton_gemm import SHAPES, gemm_race

    calls_seen = [0]

    def no_eviction() -> None:
        calls_seen[0] += 1

    rows = []
    with cute_guard() as stand_in:
        for m, n, k in SHAPES[:count]:
            calls = gemm_race(m, n, k, device)
            latencies: dict[str, tuple[float, ...]] = {}
            order = ["stock_a", "plugin", "none", "stock_b"] + (
                ["calibrated"] if calibrated else []
            )
            for way in order:
                if way in ("plugin", "calibrated"):
                    nbytes = window if way == "plugin" or calibrated is None else calibrated
                    install(_choice_at(weights, nbytes))
                try:
                    eviction = no_eviction if way == "none" else None  # None: b12x's own lookup
                    latencies[way] = run_race(calls, device, eviction).latencies_us
                finally:
                    restore()
            base = latencies["stock_a"]
            best = min(base)
            row: dict[str, Any] = {"shape": [m, n, k], "latencies_us": latencies}
            for way, values in latencies.items():
                chosen = min(range(len(values)), key=values.__getitem__)
                row[f"{way}_winner"] = chosen
                row[f"{way}_regret"] = base[chosen] / best - 1
            rows.append(row)
            log(
                f"race {m}x{n}x{k}: winners "
                + ", ".join(f"{w}={row[f'{w}_winner']}" for w in order)
            )
            del calls
    ways = [w for w in ("plugin", "stock_b", "none", "calibrated") if f"{w}_winner" in rows[0]]

    def best_ratio(row: dict[str, Any], way: str) -> float:
        return float(min(row["latencies_us"][way]) / min(row["latencies_us"]["stock_a"]))

    summary = {
        way: {
            "agree_with_stock_a": sum(r[f"{way}_winner"] == r["stock_a_winner"] for r in rows),
            "mean_regret": statistics.fmean(r[f"{way}_regret"] for r in rows),
            "max_regret": max(r[f"{way}_regret"] for r in rows),
            # What eviction is for: without it the winner's latency is measured warm.
            "mean_best_latency_ratio": statistics.fmean(best_ratio(r, way) for r in rows),
            "min_best_latency_ratio": min(best_ratio(r, way) for r in rows),
        }
        for way in ways
    }
    return {
        "races": rows,
        "summary": summary,
        "evictions_per_session": calls_seen[0],
        "cute_guard_stand_in": stand_in,
    }


def run_bench(
    device: torch.device,
    out_dir: Path,
    *,
    repetitions: int = 480,
    rounds: int = 8,
    races: int = 20,
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
    plugin = _plugin_at(weights, window)

    # 3. Cost at the default window against the HBM read floor, measured here.
    bandwidth = _hbm_read_bandwidth(device)
    stock_flush = _stock_method(window, device)
    stock_t = time_call(stock_flush, repetitions=128, device=device)
    plugin_t = time_call(plugin, repetitions=128, device=device)
    floor_us = window / bandwidth * 1e6
    result["cost"] = {
        "hbm_read_bytes_per_s": bandwidth,
        "floor_us": floor_us,
        "stock_us": stock_t.median,
        "plugin_us": plugin_t.median,
        "plugin_over_floor": plugin_t.median / floor_us,
        "stock_over_floor": stock_t.median / floor_us,
    }
    del stock_flush
    torch.cuda.empty_cache()

    # 2 and 5. Efficacy curves; the smallest window that evicts as well as stock.
    default = round(window / l2, 4)
    factors = sorted({*WINDOW_FACTORS, default})
    curves = _efficacy(device, l2, weights, factors, repetitions, rounds, log)
    result["efficacy"] = curves
    result["default_factor"] = default
    factor = _calibrated_factor(curves, factors, default)
    calibrated = None if factor is None else int(l2 * factor) // 4 * 4
    result["calibrated"] = {"factor": factor, "window_bytes": calibrated}
    if calibrated:
        result["calibrated"]["plugin_us"] = time_call(
            _plugin_at(weights, calibrated), repetitions=128, device=device
        ).median

    # 4. Race agreement: stock twice, plugin, no eviction (and the calibrated window).
    result["races"] = _races(
        device, weights, window, calibrated if calibrated != window else None, races, log
    )

    # 7. Start-up cost: evictions of the race session above times each's per-call time.
    calls = result["races"]["evictions_per_session"]
    result["startup_cost_ms"] = {
        "evictions": calls,
        "stock": calls * stock_t.median / 1e3,
        "plugin": calls * plugin_t.median / 1e3,
        "calibrated": None if not calibrated else calls * result["calibrated"]["plugin_us"] / 1e3,
    }

    # 6. Hook cost on the CPU.
    result["hook_cost"] = choice_times()

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(result, indent=2, default=str))
    result["plot"] = _plot(curves, l2, default, out_dir / "efficacy.png")
    return result


def _hbm_read_bandwidth(device: torch.device) -> float:
    """Bytes per second of a 1 GiB read, reduced row-wise as the plugin reads."""
    return _GIB / (time_call(_gib_read(device), repetitions=64, device=device).median * 1e-6)


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
        stock = [w["stock"] for w in curve["windows"].values()]
        plugin = [w["plugin"] for w in curve["windows"].values()]
        axis.plot(factors, stock, "--o", color=color, label=f"stock, probe {fraction} x L2")
        axis.plot(factors, plugin, "-s", color=color, label=f"plugin, probe {fraction} x L2")
    axis.axvline(default, color="grey", linewidth=0.8)
    axis.set_xlabel(f"eviction window (x L2 = {l2 / MiB:.0f} MiB); grey: stock default")
    axis.set_ylabel("probe coldness (0 warm, 1 after 1 GiB read)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return str(path)


def summary_table(result: dict[str, Any]) -> str:
    """The short table printed last."""
    mem, cost, races = result["memory"], result["cost"], result["races"]["summary"]
    default = str(result["default_factor"])
    lines = [
        f"bench: {result['gpu']}, L2 {result['l2_bytes'] / MiB:.0f} MiB, torch {result['torch']}, "
        f"b12x {result['b12x']}",
        f"1 memory per race job (held/peak B): stock {mem['stock']['held_bytes']:,}/"
        f"{mem['stock']['peak_bytes']:,}  plugin {mem['plugin']['held_bytes']:,}/"
        f"{mem['plugin']['peak_bytes']:,}",
    ]
    for fraction, curve in result["efficacy"].items():
        at = curve["windows"][default]
        worst = min(w["plugin"] - w["stock"] for w in curve["windows"].values())
        noise = max(w["noise"] for w in curve["windows"].values())
        lines.append(
            f"2 efficacy probe {fraction} x L2 at default window: stock {at['stock']:.3f} "
            f"plugin {at['plugin']:.3f}; worst plugin-stock over windows {worst:+.3f}; "
            f"noise <= {noise:.3f}"
        )
    lines.append(
        f"3 eviction per sample: stock {cost['stock_us']:.1f} us, "
        f"plugin {cost['plugin_us']:.1f} us, floor {cost['floor_us']:.1f} us "
        f"(HBM {cost['hbm_read_bytes_per_s'] / 1e12:.2f} TB/s); "
        f"plugin/floor {cost['plugin_over_floor']:.2f}"
    )
    count = len(result["races"]["races"])
    for way, figures in races.items():
        agree = figures["agree_with_stock_a"]
        lines.append(
            f"4 races ({count}) {way:>10}: agrees with stock {agree}/{count}, "
            f"regret mean {figures['mean_regret']:.2%} max {figures['max_regret']:.2%}; "
            f"winner latency vs stock mean {figures['mean_best_latency_ratio'] - 1:+.1%} "
            f"min {figures['min_best_latency_ratio'] - 1:+.1%}"
        )
    calibrated = result["calibrated"]
    if calibrated["factor"]:
        lines.append(
            f"5 calibrated window: {calibrated['factor']} x L2 = {calibrated['window_bytes']:,} B, "
            f"eviction {calibrated['plugin_us']:.1f} us vs stock {cost['stock_us']:.1f} us"
        )
    else:
        lines.append("5 calibrated window: none of the grid matches stock's default")
    for row in result["hook_cost"]:
        lines.append(
            f"6 source choice (CPU) {row['tensors']:>7,} tensors: {row['median_ms']:.1f} ms"
        )
    startup = result["startup_cost_ms"]
    shown = ", ".join(
        f"{k} {v:.1f} ms" for k, v in startup.items() if k != "evictions" and v is not None
    )
    lines.append(f"7 start-up eviction time over {startup['evictions']:,} evictions: {shown}")
    return "\n".join(lines)
