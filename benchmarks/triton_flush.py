"""Triton's ``do_bench`` flush, stock against the plugin's Triton wing, on one CUDA GPU (issue 47).

Uses the real wing (``flare_l2evict._triton``: proof, seam, flush) over a
:class:`WeightEviction` of resident weight tensors this script allocates, and measures:

(a) the peak memory growth of one ``do_bench`` call and of one whole ``@triton.autotune``
    (six configs), stock against the plugin at each scratch size;
(b) one flush's time, stock (zeroing 256 MiB) against the plugin's (read the window, zero the
    scratch) and the window read alone, as median [min-max] over repeats;
(c) choices: 36 autotuned cases of 6 configs each (18 bf16 matmul shapes, 9 memory-bound
    kernels over 0.1 to 3 x L2, 9 matmuls whose B operand lies in the window the flush reads),
    each arm's picks against a first stock run: stock re-runs (the noise floor), no flush, and
    the plugin with a scratch of 0.25, 0.5 and 1 x L2; agreements out of 36 per repeat, arms
    interleaved within each repeat.

    python benchmarks/triton_flush.py [--repeats 3] [--rep 40] [--warmup 10] [--scratch 0.25 0.5 1]

The defaults fit in under 8 minutes on an H100 (estimated up front, printed). Imports Triton
only after the arguments are read, so ``--help`` runs anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from flare_l2evict._eviction import WeightEviction
from flare_l2evict._triton.flush import scratch_bytes
from flare_l2evict._triton.proof import METHODS, prove_triton
from flare_l2evict._triton.seam import TritonSeam
from flare_l2evict.tools._choose_weights import choose_weights
from flare_l2evict.tools.cli._runner import EXIT_USAGE
from flare_l2evict.tools.cli._shared import Parser, error_line, whole_number_in

PROG = "python benchmarks/triton_flush.py"
STOCK_BYTES = 256 * 1024 * 1024
"""What stock's ``get_empty_cache_for_benchmark`` makes per ``do_bench`` call, on every GPU."""
MiB = 1 << 20

MATMUL_CONFIGS: tuple[tuple[int, int, int, int, int], ...] = (
    (16, 64, 64, 4, 2),
    (32, 64, 64, 4, 3),
    (64, 64, 32, 4, 3),
    (64, 128, 32, 4, 4),
    (128, 64, 64, 8, 3),
    (128, 128, 32, 8, 3),
)
"""(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); every K below is a multiple of 64."""
MATMUL_SHAPES: tuple[tuple[int, int, int], ...] = tuple(
    (m, n, k)
    for n, k in ((2048, 2048), (4096, 4096), (8192, 2048), (2048, 8192), (4096, 1024), (1024, 4096))
    for m in (16, 64, 256)
)
"""(M, N, K): 18 bf16 matmuls."""
STREAM_CONFIGS: tuple[tuple[int, int], ...] = (
    (256, 2), (512, 4), (1024, 4), (2048, 8), (4096, 8), (8192, 16),
)  # fmt: skip
"""(BLOCK, num_warps) of the memory-bound kernel."""
STREAM_FACTORS: tuple[float, ...] = (0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
"""Its input, in L2s (the output is as large): 9 memory-bound cases."""
WINDOW_SHAPES: tuple[tuple[int, int, int], ...] = tuple(
    (m, n, k) for n, k in ((4096, 2048), (2048, 4096), (3072, 3072)) for m in (16, 64, 256)
)
"""(M, N, K): 9 matmuls whose B (K x N, bf16: 16 to 18 MiB each) is a view of the weights'
tail, which the eviction window reads."""


@dataclass
class Case:
    """One autotuned case: ``run`` tunes it when its autotuner's cache is empty."""

    kind: str
    name: str
    run: Callable[[], None]
    tuner: Any
    configs: list[Any]
    operand: torch.Tensor | None = None
    """The B operand of a window matmul: a view of the weights' tail."""

    def pick(self) -> int:
        best = self.tuner.best_config
        return next(i for i, config in enumerate(self.configs) if config is best)


@dataclass
class Arm:
    """One way of flushing, and the picks of each of its runs."""

    name: str
    enter: Callable[[], contextlib.AbstractContextManager[object]]
    picks: list[list[int]] = field(default_factory=list)


def agreements(reference: Sequence[int], picks: Sequence[int]) -> int:
    """How many cases picked the reference's config."""
    return sum(a == b for a, b in zip(reference, picks, strict=True))


def by_kind(kinds: Sequence[str], reference: Sequence[int], picks: Sequence[int]) -> str:
    """Agreements per kind of case, as ``matmul 15/18, memory 6/9, window 8/9``."""
    shown = []
    for kind in dict.fromkeys(kinds):
        at = [i for i, k in enumerate(kinds) if k == kind]
        same = sum(reference[i] == picks[i] for i in at)
        shown.append(f"{kind} {same}/{len(at)}")
    return ", ".join(shown)


def spread(values: Sequence[float], unit: str = "us") -> str:
    """``median [min-max] unit`` of the values."""
    return (
        f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}] {unit}"
        if values
        else "-"
    )


def choices_table(kinds: Sequence[str], reference: Sequence[int], arms: Sequence[Arm]) -> str:
    """One line per arm: its agreements with the reference per repeat, and per kind in all."""
    total = len(reference)
    lines = [f"{'arm':<22} agreements out of {total} per repeat   by kind (all repeats)"]
    for arm in arms:
        counts = " ".join(f"{agreements(reference, p):>2}" for p in arm.picks)
        kind_line = "; ".join(by_kind(kinds, reference, p) for p in arm.picks)
        lines.append(f"{arm.name:<22} {counts:<35} {kind_line}")
    return "\n".join(lines)


def _factor(text: str) -> float:
    """A factor of the L2 in (0, 8]: an argparse ``type``."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 8:
        raise argparse.ArgumentTypeError(f"'{text[:40]}' is not a factor of the L2 in (0, 8]")
    return value


def parser() -> argparse.ArgumentParser:
    """The bench's parser (``--help`` and usage errors need no GPU and import no Triton)."""
    bench = Parser(
        prog=PROG,
        description="Triton's do_bench flush: stock against the plugin's wing (one CUDA GPU).",
    )
    bench.add_argument("--device", default="cuda", help="the CUDA device (default: cuda)")
    count = whole_number_in(1, 1000)
    bench.add_argument(
        "--repeats", type=count, default=3, help="runs of each arm after the reference (default: 3)"
    )
    bench.add_argument("--rep", type=count, default=40, help="do_bench's rep, ms (default: 40)")
    bench.add_argument(
        "--warmup", type=count, default=10, help="do_bench's warmup, ms (default: 10)"
    )
    bench.add_argument(
        "--scratch",
        type=_factor,
        nargs="+",
        default=[0.25, 0.5, 1.0],
        help="the plugin's scratch sizes, in L2s (default: 0.25 0.5 1)",
    )
    bench.add_argument(
        "--window", type=_factor, default=2.0, help="the eviction window, in L2s (default: 2)"
    )
    bench.add_argument(
        "--flushes", type=count, default=200, help="flushes per timing sample (default: 200)"
    )
    return bench


def _kernels() -> tuple[Any, Any]:
    """The bf16 matmul and the memory-bound kernel (Triton is imported here, on a GPU)."""
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,  # type: ignore[no-untyped-def]
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a_tile = tl.load(
                a + rm[:, None] * sam + (k0 + rk)[None, :] * sak, mask=rm[:, None] < M, other=0.0
            )
            b_tile = tl.load(
                b + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn, mask=rn[None, :] < N, other=0.0
            )
            acc += tl.dot(a_tile, b_tile)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.bfloat16), mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def stream(x, y, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y + offsets, tl.load(x + offsets, mask=mask) * 2.0 + 1.0, mask=mask)

    return matmul, stream


def _tuned(kernel: Any, configs: list[Any], key: list[str], bench: Callable[..., Any]) -> Any:
    import triton

    return triton.autotune(configs=configs, key=key, do_bench=bench)(kernel)


def cases(
    device: torch.device, l2: int, weights: torch.Tensor, bench: Callable[..., Any]
) -> list[Case]:
    """The 36 cases, their inputs made here; the window matmuls' B views ``weights``' tail."""
    import triton

    matmul, stream = _kernels()
    mm_configs = [
        triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in MATMUL_CONFIGS
    ]
    st_configs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in STREAM_CONFIGS]
    plain = _tuned(matmul, mm_configs, ["M", "N", "K"], bench)
    windowed = _tuned(matmul, mm_configs, ["M", "N", "K"], bench)  # its own cache
    streamed = _tuned(stream, st_configs, ["n"], bench)
    made = [_matmul_case("matmul", plain, mm_configs, s, device, None) for s in MATMUL_SHAPES]
    for factor in STREAM_FACTORS:
        n = int(l2 * factor) // 4
        x, y = torch.randn(n, device=device), torch.empty(n, device=device)

        def run(x: torch.Tensor = x, y: torch.Tensor = y, n: int = n) -> None:
            streamed[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)

        made.append(Case("memory", f"{factor} x L2", run, streamed, st_configs))
    end = weights.numel()
    for shape in WINDOW_SHAPES:
        _, n, k = shape
        b = weights[end - k * n : end].view(k, n)
        made.append(_matmul_case("window", windowed, mm_configs, shape, device, b))
        made[-1].operand = b
        if shape[0] == WINDOW_SHAPES[-1][0]:  # each B once: the next (N, K) lies below it
            end -= k * n
    return made


def _matmul_case(
    kind: str, tuner: Any, configs: list[Any], shape: tuple[int, int, int],
    device: torch.device, b: torch.Tensor | None,
) -> Case:  # fmt: skip
    import triton

    m, n, k = shape
    a = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    if b is None:
        b = torch.randn(k, n, dtype=torch.bfloat16, device=device) / k**0.5
    c = torch.empty(m, n, dtype=torch.bfloat16, device=device)

    def run() -> None:
        grid = lambda meta: (triton.cdiv(n, meta["BN"]), triton.cdiv(m, meta["BM"]))  # noqa: E731
        tuner[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                    c.stride(0), c.stride(1))  # fmt: skip

    return Case(kind, f"{m}x{n}x{k}", run, tuner, configs)


def in_window(eviction: WeightEviction, tensor: torch.Tensor) -> bool:
    """Whether every byte of ``tensor`` lies in one of the views the eviction reads."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    return any(
        view.data_ptr() <= start and end <= view.data_ptr() + view.numel() * view.element_size()
        for view in eviction.views()
    )


def run_arm(all_cases: Sequence[Case]) -> list[int]:
    """Tune every case afresh (each autotuner's cache emptied) and return its picks."""
    for tuner in {id(case.tuner): case.tuner for case in all_cases}.values():
        tuner.cache.clear()
    picks = []
    for case in all_cases:
        case.run()
        picks.append(case.pick())
    return picks


@contextlib.contextmanager
def no_flush() -> Iterator[object]:
    """Both driver methods replaced by ones that do nothing: the bench's own arm."""
    import triton

    driver = triton.runtime.driver.active
    driver.get_empty_cache_for_benchmark = lambda: None
    driver.clear_cache = lambda cache: None
    try:
        yield None
    finally:
        for method in METHODS:
            vars(driver).pop(method, None)


@contextlib.contextmanager
def plugin(eviction: WeightEviction, scratch: int) -> Iterator[TritonSeam]:
    """The real wing: proven on this Triton, installed, undone."""
    verdict = prove_triton()
    if verdict.proof is None:
        _refused(f"the Triton seam is not proven: {verdict.reason}", "see the reason")
    seam, undo = TritonSeam(verdict.proof, scratch), list[Callable[[], None]]()
    seam.install(eviction, undo)
    try:
        yield seam
    finally:
        for step in reversed(undo):
            step()


def peak_growth(device: torch.device, work: Callable[[], object]) -> int:
    """How far ``work`` raised torch's peak allocated memory on ``device`` above what it held."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    work()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


def flush_times(
    device: torch.device, flush: Callable[[], None], flushes: int, repeats: int
) -> list[float]:
    """Microseconds per flush, one figure per repeat of ``flushes`` back-to-back flushes."""
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        flush()
        start.record()
        for _ in range(flushes):
            flush()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) * 1e3 / flushes)
    return times


def memory_section(device: torch.device, args: argparse.Namespace, eviction: WeightEviction,
                   l2: int, one: Case, bench: Callable[..., Any]) -> list[str]:  # fmt: skip
    """(a): peak growth of one do_bench call and of one whole autotune, stock and plugin."""
    probe = torch.empty(1 << 20, device=device)
    call = functools.partial(bench, lambda: probe.add_(1.0))
    autotune = functools.partial(run_arm, [one])
    lines = ["(a) peak memory growth, bytes: one do_bench call / one autotune (6 configs)"]
    lines.append(
        f"  stock           {peak_growth(device, call):>13,} / {peak_growth(device, autotune):>13,}"
    )
    for factor in args.scratch:
        with plugin(eviction, scratch_bytes(l2, factor)) as seam:
            grown = (peak_growth(device, call), peak_growth(device, autotune))
        served = f"(served {seam.counts.calls} calls, {seam.counts.flushes} flushes)"
        lines.append(f"  plugin {factor:>4} x L2 {grown[0]:>13,} / {grown[1]:>13,}  {served}")
    return lines


def time_section(device: torch.device, args: argparse.Namespace, eviction: WeightEviction,
                 l2: int) -> list[str]:  # fmt: skip
    """(b): one flush's time, stock against the plugin's and against the window read alone."""
    import triton

    driver, n, r = triton.runtime.driver.active, args.flushes, max(5, args.repeats * 3)
    lines = [f"(b) one flush, median [min-max] over {r} samples of {n} flushes"]
    stock = functools.partial(driver.clear_cache, driver.get_empty_cache_for_benchmark())
    made = stored(stock.args[0])
    lines.append(f"  stock, zero {made}: {spread(flush_times(device, stock, n, r))}")
    del stock
    read = spread(flush_times(device, eviction, n, r))
    lines.append(f"  the window read alone, {eviction.read_bytes:,} B: {read}")
    for factor in args.scratch:
        with plugin(eviction, scratch_bytes(l2, factor)):
            served = functools.partial(driver.clear_cache, driver.get_empty_cache_for_benchmark())
            timed = flush_times(device, served, n, r)
            del served
        lines.append(f"  plugin, the read then zero {factor} x L2: {spread(timed)}")
    return lines


def stored(buffer: object) -> str:
    return f"{buffer.untyped_storage().nbytes():,} B" if isinstance(buffer, torch.Tensor) else "?"


def choices_section(args: argparse.Namespace, eviction: WeightEviction, l2: int,
                    all_cases: list[Case]) -> list[str]:  # fmt: skip
    """(c): each arm's picks against a first stock run, arms interleaved within each repeat."""
    arms = [Arm("stock re-run", contextlib.nullcontext), Arm("no flush", no_flush)]
    for factor in args.scratch:
        size = scratch_bytes(l2, factor)
        arms.append(Arm(f"plugin {factor} x L2", functools.partial(plugin, eviction, size)))
    reference = run_arm(all_cases)  # compiles every config too
    for _ in range(args.repeats):
        for arm in arms:
            with arm.enter():
                arm.picks.append(run_arm(all_cases))
    kinds = [case.kind for case in all_cases]
    return ["(c) choices: agreement with a first stock run", choices_table(kinds, reference, arms)]


def _refused(cause: str, fix: str) -> NoReturn:
    print(error_line(PROG, cause, fix), file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def _device(args: argparse.Namespace) -> torch.device:
    if not torch.cuda.is_available():
        _refused("needs a CUDA GPU, and torch sees none", "run it on a GPU machine")
    device = torch.device(args.device)
    if device.type != "cuda":
        _refused(f"--device {args.device} is not a CUDA device", "--device cuda:0")
    return torch.device(
        "cuda", torch.cuda.current_device() if device.index is None else device.index
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    device = _device(args)
    torch.cuda.set_device(device)
    if os.environ.get("TRITON_CACHE_AUTOTUNING", "").lower() in ("1", "true", "on", "yes"):
        _refused("TRITON_CACHE_AUTOTUNING is on: picks would come from disk", "unset it")
    try:
        import triton
        import triton.testing
    except ImportError as error:
        _refused(f"triton is not importable ({error})", "pip install triton")
    started = time.perf_counter()
    l2 = int(torch.cuda.get_device_properties(device).L2_cache_size)
    window = int(l2 * args.window) // 4 * 4
    # Resident weights: the window reads their tail, where the window matmuls' B operands lie.
    weights = torch.randn(max(4 * l2, window + 64 * MiB) // 2, dtype=torch.bfloat16, device=device)
    eviction = WeightEviction(choose_weights({"weights": weights}, device, window), kernel="triton")
    bench = functools.partial(triton.testing.do_bench, warmup=args.warmup, rep=args.rep)
    all_cases = cases(device, l2, weights, bench)
    inside = sum(in_window(eviction, c.operand) for c in all_cases if c.operand is not None)
    arms = 1 + args.repeats * (2 + len(args.scratch))
    per_call_ms = args.rep + args.warmup + 15  # 15: do_bench's estimate and launches, roughly
    minutes = arms * len(all_cases) * len(MATMUL_CONFIGS) * per_call_ms / 6e4
    print(f"{torch.cuda.get_device_name(device)}, L2 {l2:,} B, torch {torch.__version__}, "
          f"triton {triton.__version__}; window {window:,} B ({eviction.kernel} read; holds the B "
          f"of {inside} of {len(WINDOW_SHAPES)} window matmuls), "
          f"{len(all_cases)} cases x {len(MATMUL_CONFIGS)} configs, {arms} arm runs, "
          f"do_bench warmup {args.warmup} ms rep {args.rep} ms; about "
          f"{minutes:.1f} min")  # fmt: skip
    print("\n".join(memory_section(device, args, eviction, l2, all_cases[0], bench)), flush=True)
    print("\n".join(time_section(device, args, eviction, l2)), flush=True)
    print("\n".join(choices_section(args, eviction, l2, all_cases)))
    took = time.perf_counter() - started
    print(f"stock's buffer: {STOCK_BYTES:,} B per do_bench call; the bench took {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
