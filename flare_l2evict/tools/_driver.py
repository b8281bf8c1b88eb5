"""Whether this machine plainly has no GPU driver, told before torch is imported (torch-free).

Asking ``torch.cuda`` costs torch's import: 2 to 3 s on a quiet CPU machine, 6 to
7 s on a loaded one. A machine with no driver at all can be told in milliseconds,
the way ``nvidia-smi`` finds one: the driver's library and its device files.

It answers "no driver" only when CUDA cannot work, so it never refuses a GPU
machine: CUDA's runtime reaches the driver through ``libcuda.so.1`` alone, so
when that library does not load, no CUDA call can succeed. Anything else that
hints at a GPU (an NVIDIA device file or kernel module, WSL's ``/dev/dxg``,
ROCm's ``/dev/kfd``, which torch's ``cuda`` reaches on AMD) leaves the answer to
torch; so do other systems than Linux.
"""

from __future__ import annotations

import os
import sys

DRIVER_LIBRARY = "libcuda.so.1"
"""The driver library CUDA's runtime loads, by this name, to reach any device."""

_GPU_PATHS = (
    "/dev/nvidiactl",  # the NVIDIA driver's device files (nvidia-smi opens these)
    "/dev/nvidia0",
    "/proc/driver/nvidia",  # the NVIDIA kernel module, loaded
    "/sys/module/nvidia",
    "/dev/dxg",  # WSL 2: CUDA through the Windows driver
    "/dev/kfd",  # ROCm: torch's cuda device on an AMD GPU
)


def missing_driver() -> str | None:
    """Why no CUDA device can exist here, in words; ``None``: torch must decide.

    ``None`` covers a driver that is present (even with no device, a device index past
    the last one, or a torch built without CUDA: torch alone can tell those).
    """
    if not sys.platform.startswith("linux"):
        return None
    if any(os.path.exists(path) for path in _GPU_PATHS):
        return None
    try:
        import ctypes

        # Loading maps the library without starting the driver; torch loads it all the same.
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        return f"no NVIDIA driver: {DRIVER_LIBRARY} does not load and there is no /dev/nvidiactl"
    except Exception:  # a Python without ctypes: not a proof of anything
        return None
    return None
