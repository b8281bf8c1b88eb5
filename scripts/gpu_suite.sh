#!/usr/bin/env bash
# The whole GPU suite, run on a CUDA machine from the repo root:
#   bash scripts/gpu_suite.sh [--bench]
# BENCH_ARGS adds flags to the bench (e.g. "--races 12" where device time is short).
# Wheels for what the machine lacks (b12x, pydantic, this package for its entry
# point) are expected under .whl/ (see scripts/gpu_wheels.sh). Logs and figures
# go to $OUT (default /tmp/flare-l2evict-gpu). Prints a short table last.
# Exit 2, in one line, on a machine with no CUDA device: before anything runs.
set -uo pipefail
OUT=${OUT:-/tmp/flare-l2evict-gpu}
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    >/dev/null 2>&1; then
    echo "error: scripts/gpu_suite.sh: no CUDA device here (torch.cuda.is_available() is not" \
        "True, or torch does not import); fix: run it on the GPU machine" >&2
    exit 2
fi
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="$PWD:/tmp/site"
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# The b12x provider, whichever package ships it (flashinfer-python has no b12x distribution).
python3 - <<'PY' | tee -a "$OUT/gpu.txt"
import importlib.metadata as metadata

import torch


def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


try:
    import b12x

    path = getattr(b12x, "__file__", None) or "a namespace package"
except ImportError as error:
    path, provider = None, f"none importable ({error})"
if path is not None:
    if "/flashinfer/" in path:
        provider = f"flashinfer-python {version('flashinfer-python')}"
    elif version("b12x"):
        provider = f"standalone b12x {version('b12x')}"
    else:
        provider = "b12x with no installed distribution"
    provider += f" ({path})"
print("torch", torch.__version__, "| b12x provider:", provider)
PY

files=(tests/test_gpu.py tests/test_gpu_host.py tests/test_cute_guard.py tests/test_readme.py
    tests/test_tp_nccl.py tests/test_gpu_freed.py tests/test_check.py tests/test_bench_report.py
    tests/test_gpu_evicting.py tests/test_kv_sizing.py)
python3 -m pytest -m gpu -v -s -p no:cacheprovider "${files[@]}" 2>&1 | tee "$OUT/gpu-tests.log"
tests=${PIPESTATUS[0]}
# The same tests again, in the reverse order, as an explicit list of ids: a byte figure that a
# neighbour's leftovers can move fails one of the two runs.
python3 -m pytest -m gpu -q --collect-only -p no:cacheprovider "${files[@]}" 2>/dev/null \
    | grep '::' | tac >"$OUT/gpu-ids-reversed.txt"
mapfile -t reversed_ids <"$OUT/gpu-ids-reversed.txt"
if ((${#reversed_ids[@]})); then
    python3 -m pytest -m gpu -v -s -p no:cacheprovider "${reversed_ids[@]}" 2>&1 \
        | tee "$OUT/gpu-tests-reversed.log"
    reversed=${PIPESTATUS[0]}
else
    echo "no GPU test ids collected for the reversed run" | tee "$OUT/gpu-tests-reversed.log"
    reversed=1
fi
python3 -m flare_l2evict startup --device cuda:0 --plugin l2evict --profile h200 2>&1 | tee "$OUT/startup.log"
startup=${PIPESTATUS[0]}
# Bare, as an operator runs it on a GPU server: it must pick cuda:0 itself.
python3 -m flare_l2evict check 2>&1 | tee "$OUT/check.log"
check=${PIPESTATUS[0]}
bench=0
if [[ " $* " == *" --bench "* ]]; then
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
    python3 -m benchmarks.bench --device cuda:0 --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 \
        | tee "$OUT/bench.log"
    bench=${PIPESTATUS[0]}
fi

echo
echo "== GPU suite: $(head -1 "$OUT/gpu.txt")"
grep -E "^(probe after|eviction storage|race peak|stock |read kernel|kernel=|kv sizing)" \
    "$OUT/gpu-tests.log" || true
grep -oE "guard: .*" "$OUT/gpu-tests.log" || true
grep -A 3 "over NCCL" "$OUT/gpu-tests.log" || true
echo "in order:  $(tail -1 "$OUT/gpu-tests.log")"
echo "reversed:  $(tail -1 "$OUT/gpu-tests-reversed.log")"
grep -E "^(L2 eviction storage|KV tokens|Race|Free after)|flare_l2evict: (audit|l2evict)" \
    "$OUT/startup.log" || true
cat "$OUT/check.log"
# The bench's table: everything after its "full figures" line.
if [[ -f "$OUT/bench.log" ]]; then sed -n '/^full figures/,$p' "$OUT/bench.log"; fi
echo "exit codes: tests=$tests reversed=$reversed startup=$startup check=$check bench=$bench"
exit $(( tests || reversed || startup || check || bench ))
