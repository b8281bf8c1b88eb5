"""Time ``before_first_capture`` at the plugin's input limits (CPU, real pluggy and b12x).

The hostile host's worst case at :data:`~flare_l2evict._weights.MAX_TENSORS`:
that many distinct tiny storages (one tensor each, names sorted opposite to
their addresses) that together cannot cover the window, so the shortfall walks
every one; then the same with :data:`~flare_l2evict._settings.MAX_EXCLUDE_PATTERNS`
globs, plain and with the most ``*`` a glob may hold; and as many views of one
storage. Then the globs at their limits built to make fnmatch backtrack (each one's
first part between two ``*`` matches all but its last character at every position),
over the most names the hook takes (64 characters each) and over 2,000 names of 8,000
characters (the same 16 MiB of names, in the longest names); and globs whose parts
repeat their first character and lie in every name (what costs ``exclude``'s own
search most). Each case in a fresh process. Prints figures; asserts nothing about time.

    python benchmarks/hook_at_limits.py [N] [CASE ...]    # CASE: distinct, globs, ...
"""

from __future__ import annotations

import os
import subprocess
import sys

CASE = """
import sys, time, gc
import torch
from flare_l2evict._settings import MAX_EXCLUDE_PATTERNS, MAX_PATTERN_CHARS, MAX_PATTERN_STARS
from flare_l2evict.tools.reference_host import ReferenceRuntime, plugin_manager
from flare_l2evict.tools.reference_host._host import ReferenceKVAllocator

n, kind = int(sys.argv[1]), sys.argv[2]
names = [f"model.layers.{i}.mlp.experts.w13_weight_{n - i:08d}" for i in range(n)]
if kind == "backtrack":
    names = ["a" * 56 + f"{i:08d}" for i in range(n)]
elif kind == "repeats":
    names = ["a" * 58 + f"{i:08d}" for i in range(n)]
elif kind == "long":
    names = ["a" * 7_990 + f"{i:010d}" for i in range(2_000)]
# The first part between two '*': all 'a' but its last character, as long as it can be.
fill = {"backtrack": 30, "long": MAX_PATTERN_CHARS - MAX_PATTERN_STARS - 3}.get(kind, 0)
backtracking = ["*" + "a" * fill + c + "*a*a*" for c in "bcdefghi"[:MAX_EXCLUDE_PATTERNS]]
repeating = ["*" + "a" * 20 + "*" + "a" * 20 + "*" + "a" * 19 + c + "*" for c in "bcdefghi"]
if kind == "views":
    base = torch.zeros(n)
    tensors = {name: base[i : i + 1] for i, name in enumerate(names)}
else:
    tensors = {name: torch.zeros(1) for name in names}
globs = {
    "distinct": [],
    "views": [],
    "globs": [f"model.layers.*.mlp.zz{i}.*" for i in range(MAX_EXCLUDE_PATTERNS)],
    "stars": ["*x" * (MAX_PATTERN_STARS - 1) + "*"] * MAX_EXCLUDE_PATTERNS,
    "backtrack": backtracking,
    "long": backtracking,
    "repeats": repeating[:MAX_EXCLUDE_PATTERNS],
}[kind]
config = {"plugins": {"l2evict": {"exclude": globs}}}
runtime = ReferenceRuntime(
    torch.device("cpu"), config, ReferenceKVAllocator(1 << 20), 5, 32 << 20, tensors
)
pm = plugin_manager(["l2evict"])
gc.collect()
started = time.perf_counter()
(report,) = pm.hook.before_first_capture(runtime=runtime)
took = time.perf_counter() - started
print(f"{took:.2f} s, {report.reclaimed_bytes} bytes: {(report.reason or '')[:70]}")
"""


def main() -> None:
    from flare_l2evict._weights import MAX_TENSORS

    n = int(sys.argv[1]) if len(sys.argv) > 1 else MAX_TENSORS
    wanted = set(sys.argv[2:])
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, {n:,} tensors")
    for kind, what in (
        ("distinct", "distinct tiny storages"),
        ("globs", "distinct tiny storages, the most exclude globs"),
        ("stars", "distinct tiny storages, the most globs of the most '*'"),
        ("views", "views of one storage"),
        ("backtrack", "the most globs built to backtrack, 64-character names"),
        ("long", "the same globs, 2,000 names of 8,000 characters"),
        ("repeats", "globs of repeating parts found in every name"),
    ):
        if wanted and kind not in wanted:
            continue
        ran = subprocess.run(
            [sys.executable, "-c", CASE, str(n), kind], capture_output=True, text=True
        )
        print(f"{what:56} {ran.stdout.strip() or ran.stderr.strip()[-300:]}", flush=True)


if __name__ == "__main__":
    main()
