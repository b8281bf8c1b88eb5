"""How cold an L2-resident probe is after each eviction: timed, and counted by Nsight Compute.

Two measures, each in fresh processes (``python -m benchmarks.bench._coldness``):

* **timed** (:func:`timed_run`): the probe's time after each condition,
  conditions interleaved and rotated, normalised between ``warm`` (the probe
  just ran) and a cold reference (a 1 GiB read of unrelated memory). A probe
  is a few microseconds, so its time also moves with what ran just before it;
  ``spacer`` methods run the same tiny kernel between every condition and the
  probe to take that out.
* **counted** (:func:`ncu_target` under ``ncu``): the bytes the probe kernel
  itself reads from HBM (``dram__bytes_read.sum``) or its L2 hit rate
  (``lts__t_sector_hit_rate.pct``), one metric per process, with no cache or
  clock control, profiling only the probe (``flare_probe``) between
  ``torch.cuda.profiler.start()`` and ``stop()``. HBM bytes / probe bytes is
  the physical coldness: 0 = all in L2, 1 = all from HBM.

Conditions (``stock``, ``triton`` and ``torch`` are the claim; the rest say why):

* ``stock``: b12x's own ``_l2_flush_fn`` buffer, summed to a 0-d float32;
* ``triton`` / ``torch``: the plugin's eviction over resident weights, with its
  Triton read kernel / torch's row reduction;
* ``sum_weights``: stock's kernel (``torch.sum`` to 0-d) over the plugin's bytes;
* ``triton_buffer``: the plugin's Triton kernel over a fresh buffer like stock's;
* ``triton_ca``: the Triton read without ``.cg`` (default caching);
* ``triton_reverse``: the Triton read walking the window from its end;
* ``cold_1gib``: torch's row reduction over 1 GiB of unrelated memory (the
  timed reference); ``cold_1gib_triton``: the Triton read over it.

Figures only: nothing here asserts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from flare_l2evict.tools._origin import stock_row
from flare_l2evict.tools.cli._shared import Parser

from ._child import child_env

MiB = 1 << 20
GiB = 1 << 30
PROBE_FRACTIONS = (0.125, 0.5, 0.8)
CLAIM = ("stock", "triton", "torch")
WHY = ("sum_weights", "triton_buffer", "triton_ca", "triton_reverse")
REFERENCES = ("cold_1gib", "cold_1gib_triton")
METHODS = {
    # name: (probe kernel, spacer between condition and probe)
    "plain": ("torch", False),  # the method of bench 0.3.0
    "spacer": ("torch", True),
    "triton_probe_spacer": ("triton", True),
}
NCU_METRICS = ("dram__bytes_read.sum", "lts__t_sector_hit_rate.pct")

_READ_BLOCK, _READ_ITERS, _READ_WARPS = 512, 8, 4  # as flare_l2evict._read_kernel
_PROBE_BLOCK = 2048
_KERNELS: dict[str, Any] = {}


def _triton_kernels() -> dict[str, Any]:
    """The probe (``flare_probe``, the one kernel ncu profiles) and a read with switches."""
    if _KERNELS:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def flare_probe(x, out, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        offsets = pid * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + pid, tl.sum(tl.load(x + offsets, mask=offsets < n, other=0.0)))

    @triton.jit  # type: ignore[untyped-decorator]
    def read_variant(  # type: ignore[no-untyped-def]
        x, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr, CG: tl.constexpr, REVERSE: tl.constexpr
    ):
        # flare_l2evict._read_kernel's loop, with its cache modifier and direction switchable.
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK * ITERS
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for base in range(pid * BLOCK * ITERS, n, step):
            for i in tl.static_range(ITERS):
                index = base + i * BLOCK + tl.arange(0, BLOCK)
                if REVERSE:
                    offsets = n - 1 - index
                else:
                    offsets = index
                if CG:
                    acc += tl.load(x + offsets, mask=index < n, other=0.0, cache_modifier=".cg")
                else:
                    acc += tl.load(x + offsets, mask=index < n, other=0.0)
        tl.store(out + pid, tl.sum(acc))

    _KERNELS.update(flare_probe=flare_probe, read_variant=read_variant)
    return _KERNELS


class TorchProbe:
    """Sums a buffer of ``nbytes`` into a 0-d float32 (torch's reduction): bench 0.3.0's probe."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        self.out = torch.empty((), dtype=torch.float32, device=device)
        self.nbytes = self.buffer.numel() * 4

    def __call__(self) -> None:
        torch.sum(self.buffer, dim=0, out=self.out)


class TritonProbe:
    """Reads a buffer once with plain loads: ``flare_probe``, a kernel no condition runs."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.n = buffer.numel()
        self.grid = (-(-self.n // _PROBE_BLOCK),)
        self.out = torch.empty(self.grid[0], dtype=torch.float32, device=buffer.device)
        self.kernel = _triton_kernels()["flare_probe"]
        self()

    def __call__(self) -> None:
        self.kernel[self.grid](self.buffer, self.out, self.n, BLOCK=_PROBE_BLOCK, num_warps=8)


def _variant_read(
    buffer: torch.Tensor, *, cg: bool = True, reverse: bool = False
) -> Callable[[], None]:
    """The plugin's read loop over ``buffer`` (1-d float32), switches set; warmed once."""
    kernel = _triton_kernels()["read_variant"]
    n = buffer.numel()
    out = torch.empty(8192, dtype=torch.float32, device=buffer.device)
    grid = (min(8192, -(-n // (_READ_BLOCK * _READ_ITERS))),)
    launch = partial(
        kernel[grid],
        buffer,
        out,
        n,
        BLOCK=_READ_BLOCK,
        ITERS=_READ_ITERS,
        CG=cg,
        REVERSE=reverse,
        num_warps=_READ_WARPS,
    )
    launch()
    return launch


def stock_at(nbytes: int, device: torch.device) -> Callable[[], None]:
    """Stock b12x's eviction at any size: its code (a ones buffer summed to a 0-d float32)."""
    buffer = torch.ones((nbytes + 3) // 4, dtype=torch.float32, device=device)
    out = torch.empty((), dtype=torch.float32, device=device)

    def flush() -> None:
        torch.sum(buffer, dim=0, out=out)

    return flush


def _stock_default(device: torch.device, window: int) -> Callable[[], None]:
    """b12x's own ``_l2_flush_fn`` where b12x imports; its code at ``window`` otherwise."""
    seam = stock_row().loaded()
    if seam is None:
        return stock_at(window, device)
    flush: Callable[[], None] = seam(device, enabled=True)
    return flush


def plugin_at(weights: torch.Tensor, nbytes: int, kernel: str) -> Callable[[], None]:
    """The plugin's eviction over ``nbytes`` of ``weights`` with the named read kernel."""
    from flare_l2evict._eviction import WeightEviction
    from flare_l2evict.tools._choose_weights import choose_weights

    eviction = WeightEviction(
        choose_weights({"weights": weights}, weights.device, nbytes),
        kernel=kernel,  # type: ignore[arg-type]
    )
    if eviction.kernel != kernel:
        raise RuntimeError(
            f"asked for the {kernel} read, got {eviction.kernel}: {eviction.kernel_note}"
        )
    return eviction


def gib_rows(device: torch.device) -> Callable[[], None]:
    """1 GiB of unrelated memory, reduced row-wise by torch: the cold reference and the floor."""
    unrelated = torch.ones(GiB // 4, dtype=torch.float32, device=device)
    sink = torch.empty(8192, dtype=torch.float32, device=device)

    def read() -> None:
        torch.sum(unrelated.view(8192, -1), dim=1, out=sink)

    return read


def _sum_of(tensor: torch.Tensor) -> Callable[[], None]:
    """Stock's kernel (``torch.sum`` to a 0-d float32) over any bytes."""
    sink = torch.empty((), dtype=torch.float32, device=tensor.device)

    def read() -> None:
        torch.sum(tensor, dim=0, out=sink)

    return read


def _window_tail(weights: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The bytes the plugin reads: the last ``nbytes`` of the weights' storage."""
    count = nbytes // 4
    return weights.view(-1)[weights.numel() - count :]


def conditions(
    device: torch.device,
    l2: int,
    weights: torch.Tensor,
    window: int,
    *,
    why: bool,
    grid: Sequence[float] = (),
) -> dict[str, Callable[[], None]]:
    """Every eviction compared (``name@factor`` for windows of ``factor`` x L2), and references."""
    made: dict[str, Callable[[], None]] = {
        "stock": _stock_default(device, window),
        "triton": plugin_at(weights, window, "triton"),
        "torch": plugin_at(weights, window, "torch"),
    }
    if why:
        tail = _window_tail(weights, window)
        made["sum_weights"] = _sum_of(tail)
        made["triton_buffer"] = _variant_read(torch.ones(window // 4, device=device))
        made["triton_ca"] = _variant_read(tail, cg=False)
        made["triton_reverse"] = _variant_read(tail, reverse=True)
    for factor in grid:
        nbytes = int(l2 * factor) // 4 * 4
        made[f"stock@{factor}"] = stock_at(nbytes, device)
        made[f"triton@{factor}"] = plugin_at(weights, nbytes, "triton")
    made["cold_1gib"] = gib_rows(device)
    if why:
        made["cold_1gib_triton"] = _variant_read(torch.ones(GiB // 4, device=device))
    torch.cuda.synchronize(device)
    return made


def _setup(device: torch.device) -> tuple[int, int, torch.Tensor]:
    from flare_l2evict._credit import stock_window_bytes

    l2 = int(torch.cuda.get_device_properties(device).L2_cache_size)
    window = stock_window_bytes(l2)
    # Resident weights several times the L2, as any checkpoint's largest storage is.
    weights = torch.ones(max(8 * l2, 512 * MiB) // 4, dtype=torch.float32, device=device)
    return l2, window, weights


def timed_run(
    device: torch.device,
    *,
    methods: Sequence[str],
    why: bool,
    grid: Sequence[float],
    repeats: int,
    repetitions: int,
    rounds: int,
) -> dict[str, Any]:
    """One process's timed coldness: trimmed-mean probe us per method, probe and condition."""
    from ._probe import compare, spacer

    l2, window, weights = _setup(device)
    made = conditions(device, l2, weights, window, why=why, grid=grid)
    probes = {f: TorchProbe(int(l2 * f) // 4 * 4, device) for f in PROBE_FRACTIONS}
    triton_probes = (
        {f: TritonProbe(p.buffer) for f, p in probes.items()}
        if any(METHODS[m][0] == "triton" for m in methods)
        else {}
    )
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(device),
        "l2_bytes": l2,
        "window_bytes": window,
        "pid": os.getpid(),
        "repeats": repeats,
        "repetitions": repetitions,
        "methods": {},
    }
    for method in methods:
        kind, spaced = METHODS[method]
        per_probe: dict[str, Any] = {}
        for fraction, torch_probe in probes.items():
            probe: Callable[[], None] = triton_probes[fraction] if kind == "triton" else torch_probe
            rows: dict[str, list[float]] = {}
            for _ in range(repeats):
                times = compare(
                    {"warm": probe, **made},
                    probe,
                    repetitions=repetitions,
                    rounds=rounds,
                    device=device,
                    between=spacer if spaced else None,
                )
                for name, t in times.items():
                    rows.setdefault(name, []).append(t.trimmed_mean)
            per_probe[str(fraction)] = {"probe_bytes": torch_probe.nbytes, "us": rows}
        result["methods"][method] = per_probe
    return result


def ncu_target(device: torch.device, *, why: bool, repeats: int, labels: Path) -> None:
    """The process ``ncu`` profiles: ``flare_probe`` after each condition, labels in order."""
    l2, window, weights = _setup(device)
    made = conditions(device, l2, weights, window, why=why)
    probes = {f: TorchProbe(int(l2 * f) // 4 * 4, device) for f in PROBE_FRACTIONS}
    measured = {f: TritonProbe(p.buffer) for f, p in probes.items()}
    names = ["warm", *made]
    order: list[dict[str, Any]] = []
    torch.cuda.synchronize(device)
    torch.cuda.profiler.start()  # type: ignore[no-untyped-call]
    for repeat in range(repeats):
        for fraction, warmer in probes.items():
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                warmer()  # the probe's bytes into L2 (torch's kernel: not profiled)
                if name != "warm":
                    made[name]()
                measured[fraction]()  # profiled: the only flare_probe launches in the range
                order.append(
                    {"probe": str(fraction), "condition": name, "probe_bytes": warmer.nbytes}
                )
    torch.cuda.synchronize(device)
    torch.cuda.profiler.stop()  # type: ignore[no-untyped-call]
    labels.write_text(json.dumps(order))


def ncu_path() -> str | None:
    """Nsight Compute's command line, where installed."""
    return shutil.which("ncu") or next(
        (p for p in ("/usr/local/cuda/bin/ncu",) if Path(p).is_file()), None
    )


def ncu_run(
    metric: str,
    out_dir: Path,
    tag: str,
    *,
    why: bool,
    repeats: int,
    timeout: float = 240.0,
) -> dict[str, Any]:
    """One fresh process under ``ncu`` reading ``metric`` for every probe launch."""
    ncu = ncu_path()
    if ncu is None:
        return {"metric": metric, "error": "ncu not found"}
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = out_dir / f"ncu-{tag}-labels.json"
    log = out_dir / f"ncu-{tag}.csv"
    command = [
        ncu,
        "--metrics", metric,
        "--cache-control", "none",
        "--clock-control", "none",
        "--replay-mode", "application",
        "--profile-from-start", "off",
        "--kernel-name", "regex:^flare_probe",
        "--csv", "--page", "raw", "--print-units", "base",
        "--log-file", str(log),
        sys.executable, "-m", "benchmarks.bench._coldness", "ncu-target",
        "--labels", str(labels), "--repeats", str(repeats),
        *(["--why"] if why else []),
    ]  # fmt: skip
    # Its own session, so that a timeout ends the profiled program too, not only ncu.
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return {"metric": metric, "error": f"ncu timed out after {timeout:.0f} s"}
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if done.returncode != 0 or not labels.is_file():
        tail = (done.stdout + done.stderr)[-1500:]
        if log.is_file():
            tail += log.read_text()[-1500:]
        return {"metric": metric, "error": f"ncu exit {done.returncode}: {tail}"}
    # The report goes to --log-file; stdout too, in case this ncu prints it there.
    values = parse_ncu_csv(log.read_text(), metric) or parse_ncu_csv(done.stdout, metric)
    order = json.loads(labels.read_text())
    if len(values) != len(order):
        return {
            "metric": metric,
            "error": f"{len(values)} profiled launches for {len(order)} labels",
        }
    rows = [{**o, "value": v} for o, v in zip(order, values, strict=True)]
    write_table(out_dir / f"ncu-{tag}.tsv", metric, rows)
    return {"metric": metric, "rows": rows}


def write_table(path: Path, metric: str, rows: list[dict[str, Any]]) -> None:
    """The launches ncu measured, one line each with its label: small enough to keep."""
    lines = [
        f"# {metric} of each profiled flare_probe launch, in launch order "
        "(ncu --cache-control none --clock-control none --replay-mode application)",
        f"launch\tprobe_x_L2\tprobe_bytes\tcondition_before_probe\t{metric}",
    ]
    lines += [
        f"{i}\t{r['probe']}\t{r['probe_bytes']}\t{r['condition']}\t{r['value']:.10g}"
        for i, r in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n")


def parse_ncu_csv(text: str, metric: str) -> list[float]:
    """The metric's value per profiled launch, in launch order, from ``--csv --page raw``.

    Units are asked for as base units (``--print-units base``); a units row
    that says otherwise (``Kbyte`` ...) is honoured, and values may carry
    thousands separators. Lines that are not CSV (ncu's ``==PROF==`` messages,
    the program's own output) are skipped.
    """
    import csv

    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    header = next((i for i, row in enumerate(rows) if metric in row), None)
    if header is None:
        return []
    column = rows[header].index(metric)
    scale = 1.0
    values = []
    for row in rows[header + 1 :]:
        if len(row) <= column:
            continue
        if not row[0].strip():  # the units row
            scale = _UNIT_SCALE.get(row[column].strip(), 1.0)
            continue
        if not row[0].strip().isdigit():
            continue
        values.append(float(row[column].replace(",", "")) * scale)
    return values


_UNIT_SCALE = {"Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def physical(rows: list[dict[str, Any]], metric: str) -> dict[str, dict[str, list[float]]]:
    """Per probe and condition, the values over repeats: HBM bytes / probe bytes, or hit %."""
    out: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        value = row["value"]
        if metric.startswith("dram__bytes"):
            value = value / row["probe_bytes"]
        out.setdefault(row["probe"], {}).setdefault(row["condition"], []).append(value)
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "range": max(values) - min(values),
    }


def timed_in_processes(
    out_dir: Path,
    processes: int,
    *,
    methods: Sequence[str],
    why: bool = False,
    grid: Sequence[float] = (),
    repeats: int = 3,
    repetitions: int = 240,
    rounds: int = 6,
    log: Callable[[str], None] = print,
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """:func:`timed_run` in ``processes`` fresh interpreters; each JSON kept in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for index in range(processes):
        path = out_dir / f"coldness-timed-{index + 1}.json"
        command = [
            sys.executable, "-m", "benchmarks.bench._coldness", "timed",
            "--out", str(path), "--methods", ",".join(methods),
            "--grid", ",".join(map(str, grid)), "--repeats", str(repeats),
            "--repetitions", str(repetitions), "--rounds", str(rounds),
            *(["--why"] if why else []),
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, env=child_env(), timeout=timeout
        )
        if done.returncode != 0:
            runs.append({"error": f"exit {done.returncode}: {done.stderr[-2000:]}"})
        else:
            runs.append(json.loads(path.read_text()))
        log(f"coldness (timed), fresh process {index + 1}/{processes} done")
    return runs


def ncu_in_processes(
    out_dir: Path,
    plan: Sequence[tuple[str, int]],
    *,
    why: bool = False,
    repeats: int = 4,
    log: Callable[[str], None] = print,
    first: int = 1,
    budget: float | None = None,
) -> list[dict[str, Any]]:
    """One fresh process under ``ncu`` per (metric, number) in ``plan``, numbered from ``first``.

    Past ``budget`` seconds the rest are not started, and say so.
    """
    import time

    began = time.monotonic()
    results: list[dict[str, Any]] = []
    for metric, count in plan:
        for index in range(first - 1, first - 1 + count):
            if budget is not None and time.monotonic() - began > budget:
                results.append(
                    {"metric": metric, "process": index + 1, "error": f"not run: past {budget} s"}
                )
                continue
            tag = f"{metric.split('.')[0].replace('__', '-')}-{index + 1}"
            timeout = 240.0 if budget is None else max(30.0, budget - (time.monotonic() - began))
            got = ncu_run(metric, out_dir, tag, why=why, repeats=repeats, timeout=timeout)
            got["process"] = index + 1
            results.append(got)
            log(f"coldness (ncu {metric}), fresh process {index + 1}/{count}: "
                f"{'error: ' + got['error'][:200] if 'error' in got else 'done'}")  # fmt: skip
    return results


def timed_coldness(
    run: dict[str, Any], method: str, reference: str = "cold_1gib"
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per probe and condition: coldness per in-process repeat, (t - warm) / (reference - warm)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for fraction, probe in run["methods"][method].items():
        us = probe["us"]
        warm, cold = us["warm"], us[reference]
        rows = {}
        for name, times in us.items():
            values = [(t - w) / (c - w) for t, w, c in zip(times, warm, cold, strict=True)]
            rows[name] = {**spread(values), "values": values, "us": statistics.median(times)}
        out[fraction] = rows
    return out


NCU_TOLERANCE = 0.001
"""Smallest difference in HBM bytes / probe bytes that ncu's count can call real.

Besides the probe's data, a profiled launch reads its code and constants from
HBM: a warm 7.5 MiB probe re-reads 3,840 bytes (0.05%) on an H200. Repeats
that count exactly the same bytes have no range, so without this floor a
512-byte difference would read as a verdict."""


def verdict(stock: dict[str, Any], plugin: dict[str, Any], floor: float = 0.0) -> dict[str, Any]:
    """As cold as stock: the plugin's median is no lower than stock's less the spread.

    The spread is the larger of the two ranges over the repeats (at least
    ``floor``); colder than stock counts as cold.
    """
    width = max(stock["range"], plugin["range"], floor)
    return {
        "spread": width,
        "difference": plugin["median"] - stock["median"],
        "as_cold": plugin["median"] >= stock["median"] - width,
    }


def _word(judged: dict[str, Any]) -> str:
    return "as cold" if judged["as_cold"] else f"LESS COLD ({judged['difference']:+.3f})"


def _fmt(figure: dict[str, Any], digits: int = 3) -> str:
    return f"{figure['median']:.{digits}f} [{figure['min']:.{digits}f}-{figure['max']:.{digits}f}]"


def timed_lines(
    runs: Sequence[dict[str, Any]],
    method: str,
    names: Sequence[str] = CLAIM,
    reference: str = "cold_1gib",
) -> list[str]:
    """One line per process and probe: coldness of each named condition, and the verdicts."""
    lines = []
    for index, run in enumerate(runs, 1):
        if "error" in run:
            lines.append(f"process {index}: {run['error'][:300]}")
            continue
        for fraction, rows in timed_coldness(run, method, reference).items():
            shown = "  ".join(f"{n} {_fmt(rows[n])}" for n in names if n in rows)
            verdicts = ", ".join(
                f"{n} {_word(verdict(rows['stock'], rows[n]))}"
                for n in ("triton", "torch")
                if n in rows
            )
            lines.append(
                f"process {index} {method:<19} probe {fraction:>5} x L2 "
                f"(warm {rows['warm']['us']:.2f} us, ref {rows[reference]['us']:.2f} us): "
                f"{shown}; {verdicts}"
            )
    return lines


def ncu_held(results: Sequence[dict[str, Any]]) -> list[bool]:
    """Per ncu process counting HBM bytes: plugin (both reads) as cold as stock at every probe."""
    held = []
    for got in results:
        if "error" in got or not got["metric"].startswith("dram"):
            continue
        probes = physical(got["rows"], got["metric"]).values()
        held.append(
            all(
                verdict(spread(rows["stock"]), spread(rows[n]), NCU_TOLERANCE)["as_cold"]
                for rows in probes
                for n in ("triton", "torch")
            )
        )
    return held


def ncu_lines(results: Sequence[dict[str, Any]], names: Sequence[str] = CLAIM) -> list[str]:
    """One line per ncu process and probe: the physical figure per condition."""
    lines = []
    for got in results:
        metric = got["metric"]
        if "error" in got:
            lines.append(f"ncu {metric} process {got.get('process')}: {got['error'][:400]}")
            continue
        for fraction, rows in physical(got["rows"], metric).items():
            figures = {n: spread(v) for n, v in rows.items()}
            digits = 3 if metric.startswith("dram") else 1
            shown = "  ".join(
                f"{n} {_fmt(figures[n], digits)}" for n in ("warm", *names) if n in figures
            )
            what = "HBM bytes / probe bytes" if metric.startswith("dram") else "L2 hit %"
            line = f"ncu process {got.get('process')} probe {fraction:>5} x L2, {what}: {shown}"
            if metric.startswith("dram") and "stock" in figures:
                line += "; " + ", ".join(
                    f"{n} {_word(verdict(figures['stock'], figures[n], NCU_TOLERANCE))}"
                    for n in ("triton", "torch")
                    if n in figures
                )
            lines.append(line)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.bench._coldness")
    sub = parser.add_subparsers(dest="command", required=True)
    timed = sub.add_parser("timed", help="one process's timed coldness, as JSON")
    timed.add_argument("--out", type=Path, required=True)
    timed.add_argument("--methods", default="spacer", help=f"comma list of {sorted(METHODS)}")
    timed.add_argument("--why", action="store_true", help="also the conditions that say why")
    timed.add_argument("--grid", default="", help="comma list of window factors (x L2)")
    timed.add_argument("--repeats", type=int, default=3)
    timed.add_argument("--repetitions", type=int, default=240)
    timed.add_argument("--rounds", type=int, default=6)
    target = sub.add_parser("ncu-target", help="the process ncu profiles")
    target.add_argument("--labels", type=Path, required=True)
    target.add_argument("--repeats", type=int, default=4)
    target.add_argument("--why", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device("cuda", 0)
    if args.command == "timed":
        result = timed_run(
            device,
            methods=[m for m in args.methods.split(",") if m],
            why=args.why,
            grid=[float(f) for f in args.grid.split(",") if f],
            repeats=args.repeats,
            repetitions=args.repetitions,
            rounds=args.rounds,
        )
        args.out.write_text(json.dumps(result, indent=1))
    else:
        ncu_target(device, why=args.why, repeats=args.repeats, labels=args.labels)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
