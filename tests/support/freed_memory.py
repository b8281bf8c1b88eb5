"""One start-up in which the host frees, moves or re-points its weights after the hook.

Run as ``python tests/support/freed_memory.py KIND DEVICE``, in a process of its own so
that a regression (a read of freed memory: SIGSEGV on a CPU, an illegal memory
access on a GPU) fails the calling test instead of ending pytest. On a CPU,
``python tests/support/freed_memory.py --each cpu KIND...`` runs each kind in a
process of its own too, forked from one that imported torch once (a few seconds
per kind saved); a crash there fails only that kind's test. Real pluggy,
the real plugin, b12x's real seam (``_l2_flush_fn``) and real torch; the host's
runtime is the reference host's. Prints one JSON line: the report, the audit,
and how many WARNING lines the eviction logged.

Kinds (what the host does right after ``before_first_capture``):

- ``owned-resize0`` / ``owned-resize2n``: ``resize_`` the weights' own storage;
- ``slice-alone``: the weights are slices ``base[a:b]`` and ``base`` is not
  resident: refused at the hook (credit 0, one line naming them), then the base
  is freed;
- ``slice-resize0`` / ``slice-resize2n`` / ``slice-share``: slices plus a tensor
  over the owning base; the base is resized or moved to shared memory;
- ``set``: ``weights.set_(other storage)``;
- ``swap``: ``param.data = other`` on an ``nn.Parameter``;
- ``offload``: ``param.data = param.data.to("cpu")`` (a copy, on a CPU device);
- ``dropped``: the host drops every reference to its weights (``del model``):
  only the eviction would keep them alive;
- ``none``: nothing (the control);
- ``between-races``: the weights' storage is freed on the race thread between
  two rounds of evictions (``empty_cache()`` after it on CUDA);
- ``concurrent``: another thread frees the weights' storage while
  :data:`CONCURRENT_EVICTIONS` evictions run, without ``empty_cache()`` (the
  host contract: a free the plugin sees before a read falls back; one that
  lands during a read is the host's breach, but the caching allocator keeps
  the memory mapped, so the process stays healthy).

On CUDA the freed memory is handed back with ``torch.cuda.empty_cache()`` and a
"KV cache" tensor is allocated over it before the races run.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import torch

from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator,
    ReferenceRuntime,
    plugin_manager,
)

MiB = 1 << 20
KINDS = (
    "none",
    "owned-resize0",
    "owned-resize2n",
    "slice-alone",
    "slice-resize0",
    "slice-resize2n",
    "slice-share",
    "set",
    "swap",
    "offload",
    "dropped",
    "between-races",
    "concurrent",
)
EVICTIONS = 6
CONCURRENT_EVICTIONS = 60
FREED = [
    "owned-resize0",
    "owned-resize2n",
    "slice-resize0",
    "slice-resize2n",
    "slice-share",
    "set",
    "swap",
    "offload",
    "dropped",
]
"""The kinds that free, move or re-point the weights the hook saw."""
ON_CPU = ("none", *FREED, "slice-alone")
"""The kinds the CPU tests ask for: run together, each in a forked process (:func:`freed`)."""


def freed(kind: str, device: str = "cpu") -> dict[str, Any]:
    """This script's result for ``kind`` on ``device``, run in a process of its own.

    A crash there (a read of freed memory) fails the caller's assertion instead
    of ending the test run; so does a hang (a 300 s guard). On a CPU, the kinds
    of :data:`ON_CPU` are run once for the whole test run, each forked from one
    process (:func:`_each_on_cpu`), and a crash fails only its own kind.
    """
    if device == "cpu" and kind in ON_CPU:
        outcomes, stderr = _each_on_cpu()
        outcome = outcomes[kind]
        assert outcome["exit"] == 0, f"{kind}: exit {outcome['exit']}; {stderr[-3000:]}"
        result: dict[str, Any] = outcome["result"]
        return result
    done = _script(kind, device)
    assert "illegal memory access" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    return result


@functools.cache
def _each_on_cpu() -> tuple[dict[str, Any], str]:
    """Every :data:`ON_CPU` kind's exit status and result, and the runs' stderr together."""
    done = _script("--each", "cpu", *ON_CPU)
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return outcomes, done.stderr


def _script(*arguments: str) -> subprocess.CompletedProcess[str]:
    here = Path(__file__).parent
    checkout = here.parents[1]  # tests/support/ -> the checkout, whose package the child imports
    path = os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(here / "freed_memory.py"), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
    )


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _tensors(kind: str, device: torch.device, nbytes: int) -> tuple[dict[str, Any], Any]:
    """The resident tensors, and what the host keeps to free later."""
    if kind.startswith("slice"):
        base = torch.ones(nbytes // 4, device=device).untyped_storage()
        half = nbytes // 2
        tensors: dict[str, Any] = {
            "layers.0.w": torch.empty(0, device=device).set_(base[0:half], 0, (half // 4,), (1,)),
            "layers.1.w": torch.empty(0, device=device).set_(
                base[half:nbytes], 0, (half // 4,), (1,)
            ),
        }
        if kind != "slice-alone":
            tensors["fused"] = torch.empty(0, device=device).set_(base)
        return tensors, base
    weights = torch.nn.Parameter(torch.ones(nbytes // 4, device=device), requires_grad=False)
    return {"layers.0.w": weights}, weights


def _free(kind: str, kept: Any, device: torch.device, nbytes: int) -> None:
    if kind in ("owned-resize0", "owned-resize2n"):
        kept.untyped_storage().resize_(0 if kind.endswith("0") else 2 * nbytes)
    elif kind in ("slice-alone", "slice-resize0"):
        kept.resize_(0)
    elif kind == "slice-resize2n":
        kept.resize_(2 * nbytes)
    elif kind == "slice-share":
        kept.share_memory_()  # moves a CPU storage into shared memory; a no-op on CUDA
    elif kind == "set":
        with torch.no_grad():
            kept.set_(torch.zeros(nbytes // 4, device=device).untyped_storage())
    elif kind == "swap":
        kept.data = torch.zeros(nbytes // 4, device=device)
    elif kind == "offload":
        kept.data = kept.data.to("cpu") if device.type == "cuda" else kept.data.clone()


def _race(kind: str, handles: list[Any], kept: Any, device: torch.device, nbytes: int) -> None:
    """The evictions the races run, with the free ``kind`` makes during them."""
    rounds = CONCURRENT_EVICTIONS if kind == "concurrent" else EVICTIONS
    freer = threading.Thread(target=_free, args=("owned-resize0", kept, device, nbytes))
    for number in range(rounds):
        if kind == "between-races" and number == EVICTIONS // 2:
            _free("owned-resize0", kept, device, nbytes)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if kind == "concurrent" and number == 1:
            freer.start()
        for handle in handles:
            if handle is not None:
                handle()
    if kind == "concurrent":
        freer.join()


def main(kind: str, device_name: str) -> dict[str, Any]:
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    nbytes = 256 * MiB if cuda else 4 * MiB
    config = {} if cuda else {"plugins": {"l2evict": {"window": "1MiB"}}}
    tensors, kept = _tensors(kind, device, nbytes)
    runtime = ReferenceRuntime(
        device=device,
        config=config,
        kv_allocator=ReferenceKVAllocator(1024),
        race_jobs=2,
        l2_cache_bytes=None if cuda else 32 * MiB,
        tensors=tensors,
    )
    counter = _Count()
    logging.getLogger("flare_l2evict").addHandler(counter)
    pm = plugin_manager(["l2evict"])
    (report,) = pm.hook.before_first_capture(runtime=runtime)
    del tensors
    runtime.tensors = {}  # the host's own references go with what it frees
    _free(kind, kept, device, nbytes)
    if kind == "dropped":
        kept = None  # the host's last reference
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        kv = torch.full((nbytes // 4,), 7.0, device=device)  # reuses the freed memory
    from b12x.preparation import _measurement

    # Stock b12x cannot make its buffer off CUDA (it reads the L2 size there): on a
    # CPU, the races run only where the plugin is installed.
    races = cuda or report.reclaimed_bytes > 0
    handles = [_measurement._l2_flush_fn(device, enabled=True) for _ in range(2 * races)]
    _race(kind, handles, kept, device, nbytes)
    if cuda:
        torch.cuda.synchronize(device)
        # The "KV cache" over the freed memory is intact (the eviction never writes),
        # and the device still runs work: an illegal access would have ended us here.
        healthy = (
            bool((kv == 7.0).all().item()) and float(torch.ones(64, device=device).sum()) == 64
        )
    else:
        healthy = True
    del handles
    (audit,) = pm.hook.startup_complete(runtime=runtime)
    eviction_lines = [line for line in counter.lines if "stops reading weights" in line]
    return {
        "kind": kind,
        "credited": report.reclaimed_bytes,
        "reason": report.reason,
        "fallback_reason": audit.fallback_reason,
        "shortfall_bytes": audit.shortfall_bytes,
        "audit_warns": audit.warns,
        "audit": audit.summary(),
        "eviction_warnings": len(eviction_lines),
        "healthy": healthy,
    }


def each(device_name: str, kinds: list[str]) -> dict[str, Any]:
    """Each kind's exit status and result, each run in a child forked from this process.

    This process has imported torch and b12x's seam module but run no torch work (no
    thread pool yet): each child starts as a fresh process would after its imports.
    """
    from b12x.preparation import _measurement  # noqa: F401  # imported once, before the forks

    outcomes: dict[str, Any] = {}
    for kind in kinds:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one kind, its result on the pipe, out without cleanup
            os.close(read)
            code = 1
            try:
                with os.fdopen(write, "w") as pipe:
                    pipe.write(json.dumps(main(kind, device_name)))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as pipe:
            text = pipe.read()
        _, status = os.waitpid(pid, 0)
        exit_code = os.waitstatus_to_exitcode(status)
        outcomes[kind] = {"exit": exit_code, "result": json.loads(text) if exit_code == 0 else None}
    return outcomes


if __name__ == "__main__":
    if sys.argv[1] == "--each":
        print(json.dumps(each(sys.argv[2], sys.argv[3:])))
    else:
        print(json.dumps(main(sys.argv[1], sys.argv[2])))
