"""The exploration that chose the bench race set (ran once on an H200; kept as it ran)."""
import json, statistics, time, os
import torch, triton, triton.language as tl
from flare_l2evict.tools.bench._probe import time_after, time_call, compare, Probe

dev = torch.device("cuda", 0)
props = torch.cuda.get_device_properties(dev)
L2 = props.L2_cache_size
OUT = os.environ.get("OUT", "/tmp")
res = {"gpu": props.name, "sms": props.multi_processor_count}

@triton.jit
def gemv(a, b, c, c32, M, N, K, sam, sak, sbk, sbn, scm, scn,
         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k_per = K // SPLIT
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(pid_k * k_per, pid_k * k_per + k_per, BK):
        a_t = tl.load(a + rm[:, None] * sam + (k0 + rk)[None, :] * sak, mask=rm[:, None] < M, other=0.0)
        b_t = tl.load(b + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn, mask=rn[None, :] < N, other=0.0)
        acc += tl.dot(a_t, b_t)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT == 1:
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.bfloat16), mask=mask)
    else:
        tl.atomic_add(c32 + rm[:, None] * N + rn[None, :], acc, mask=mask)

POOL = [  # BN, BK, SPLIT, warps, stages
    (64, 128, 1, 4, 1), (128, 128, 1, 4, 1), (64, 128, 1, 4, 4), (128, 64, 1, 4, 3),
    (256, 64, 1, 8, 3), (64, 128, 4, 4, 3), (64, 64, 8, 4, 3), (128, 64, 16, 4, 2),
    (32, 256, 8, 4, 2), (128, 128, 2, 8, 2),
]
NK = [(2048, 2048), (4096, 2048), (2048, 4096), (4096, 4096), (6144, 2048), (2048, 6144),
      (1024, 4096), (4096, 1024), (8192, 2048), (2048, 8192), (3072, 3072), (5120, 2048)]
MS = [1, 4, 16]

def make_calls(m, n, k):
    from b12x.preparation.types import PreparedCall
    x = torch.empty(m, k, dtype=torch.bfloat16, device=dev)
    w = torch.randn(k, n, dtype=torch.bfloat16, device=dev) / k**0.5
    out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    out32 = torch.empty(m, n, dtype=torch.float32, device=dev)
    def produce():
        x.normal_()
    calls, runs = [], []
    for bn, bk, split, warps, stages in POOL:
        grid = (triton.cdiv(n, bn), split, 1)
        def run(grid=grid, bn=bn, bk=bk, split=split, warps=warps, stages=stages):
            if split > 1:
                out32.zero_()
            gemv[grid](x, w, out, out32, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                       out.stride(0), out.stride(1), BM=16, BN=bn, BK=bk, SPLIT=split,
                       num_warps=warps, num_stages=stages)
        run(); runs.append(run)
        calls.append(PreparedCall(run=run, produce=produce))
    torch.cuda.synchronize()
    return calls, runs, produce

flush_buf = torch.ones(max(2 * L2, 64 << 20) // 4, dtype=torch.float32, device=dev)
flush_out = torch.empty((), dtype=torch.float32, device=dev)
def flush():
    torch.sum(flush_buf, dim=0, out=flush_out)

t0 = time.time()
pool_rows = []
race_rows = []
from flare_l2evict.tools.reference_host._races import cute_guard, run_race
def noop():
    pass
with cute_guard():
    for n, k in NK:
        for m in MS:
            calls, runs, produce = make_calls(m, n, k)
            cold = [[] for _ in runs]; warm = [[] for _ in runs]
            for rep in range(3):
                for i, run in enumerate(runs):
                    cold[i].append(time_after(lambda: (flush(), produce()), run, repetitions=24, device=dev).trimmed_mean)
                    warm[i].append(time_after(produce, run, repetitions=24, device=dev).trimmed_mean)
            pool_rows.append({"shape": [m, n, k], "cold": cold, "warm": warm})
            ways = {}
            for way in ("stock_a", "none_a", "stock_b", "none_b"):
                ways[way] = run_race(calls, dev, None if way.startswith("stock") else noop).latencies_us
            race_rows.append({"shape": [m, n, k], "lat": ways})
            win = {w: min(range(len(v)), key=v.__getitem__) for w, v in ways.items()}
            print(m, n, k, "cold", [round(statistics.median(c), 1) for c in cold], "warm", [round(statistics.median(c), 1) for c in warm], win, flush=True)
            del calls, runs
res["pool"] = pool_rows; res["races"] = race_rows; res["POOL"] = POOL
print("races took", time.time() - t0, flush=True)
json.dump(res, open(f"{OUT}/explore.json", "w"))

# ---- Part B: eviction kernels
@triton.jit
def _read(x, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK * ITERS
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for base in range(pid * BLOCK * ITERS, n, step):
        for i in tl.static_range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x + offs, mask=offs < n, other=0.0, cache_modifier=".cg")
    tl.store(out + pid, tl.sum(acc))

@triton.jit
def _read_nomask(x, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid * BLOCK * ITERS
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x + offs, cache_modifier=".cg")
    tl.store(out + pid, tl.sum(acc))

window = max(2 * L2, 64 << 20)
weights = torch.ones((4 * window) // 4, dtype=torch.float32, device=dev)
tail = weights[-(window // 4):]
n = tail.numel()
part = torch.zeros(8192, dtype=torch.float32, device=dev)
big = torch.ones(1 << 28, dtype=torch.float32, device=dev)
def read_1g():
    torch.sum(big.view(8192, -1), dim=1, out=part)
variants = {}
from b12x.preparation._measurement import _l2_flush_fn
variants["stock"] = _l2_flush_fn(dev, enabled=True)
v8192 = tail.view(8192, -1)
variants["torch rows=8192"] = lambda: torch.sum(v8192, dim=1, out=part)
for block, iters, warps, cap in [(1024, 8, 4, 8192), (1024, 4, 4, 8192), (2048, 4, 8, 8192), (512, 8, 4, 8192),
                                 (1024, 8, 8, 8192), (1024, 8, 4, 2 * props.multi_processor_count * 4),
                                 (2048, 8, 8, 8192)]:
    grid = min(triton.cdiv(n, block * iters), cap)
    variants[f"triton b{block} i{iters} w{warps} g{grid}"] = (
        lambda g=grid, b=block, it=iters, w=warps: _read[(g,)](tail, part, n, BLOCK=b, ITERS=it, num_warps=w))
for block, iters, warps in [(1024, 8, 4), (2048, 4, 8)]:
    grid = n // (block * iters)
    if grid * block * iters == n and grid <= 8192:
        variants[f"nomask b{block} i{iters} w{warps}"] = (
            lambda g=grid, b=block, it=iters, w=warps: _read_nomask[(g,)](tail, part, n, BLOCK=b, ITERS=it, num_warps=w))
for v in variants.values():
    v()
torch.cuda.synchronize()
cost = {k: [] for k in variants}; floor = []
for rep in range(3):
    floor.append(window / (big.numel() * 4 / (time_call(read_1g, repetitions=64, device=dev).median * 1e-6)) * 1e6)
    for name, v in variants.items():
        cost[name].append(time_call(v, repetitions=128, device=dev).median)
probes = {f: Probe(int(L2 * f) // 4 * 4, dev) for f in (0.125, 0.5, 0.8)}
cold = {}
for rep in range(3):
    for f, probe in probes.items():
        conds = {"warm": probe, "cold": read_1g, **variants}
        times = compare(conds, probe, repetitions=240, rounds=6, device=dev)
        w, h = times["warm"].trimmed_mean, times["cold"].trimmed_mean
        for name in variants:
            cold.setdefault(name, {}).setdefault(str(f), []).append((times[name].trimmed_mean - w) / (h - w))
print("floor us per rep", [round(x, 2) for x in floor])
for name in variants:
    c = cost[name]
    print(f"{name:34s} us {[round(x,1) for x in c]} x floor {[round(a/b,3) for a,b in zip(c, floor)]} cold " +
          " | ".join(f"{f}: " + ",".join(f"{x:.3f}" for x in cold[name][f]) for f in cold[name]), flush=True)
res["evict"] = {"floor": floor, "cost": cost, "cold": cold}
json.dump(res, open(f"{OUT}/explore.json", "w"))
print("total", time.time() - t0)
