"""Time ``flare-l2evict plan`` on a DeepSeek-class index: ~160 files, ~90,000 tensors.

The synthetic checkpoint has real safetensors headers and sparse data, so it
takes no disk. Prints the plan and the time; asserts nothing about time.

    python -m benchmarks.plan_index [--tp 4]
"""

from __future__ import annotations

import sys
import tempfile
import time

from flare_l2evict.tools import main as cli
from flare_l2evict.tools.reference_host import write_sparse_index


def main() -> None:
    tp = sys.argv[sys.argv.index("--tp") + 1] if "--tp" in sys.argv else "4"
    with tempfile.TemporaryDirectory() as directory:
        index = write_sparse_index(directory)
        start = time.perf_counter()
        cli(["plan", str(index), "--tp", tp, "--profile", "gb202"])
        print(f"wall time of the whole plan command: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
