"""A CUDA device's persisting-L2 carve-out, which no eviction reaches.

Lines a kernel marks persisting (a stream's access-policy window) live in the
part of L2 set aside by ``cudaLimitPersistingL2CacheSize``. Neither stock
b12x's buffer read nor the plugin's weight read evicts them, so a race whose
inputs sit there runs warm. torch has no getter for the limit: it is read
through cuda-bindings' runtime, else through the CUDA runtime torch loaded.
Torch is imported only to read it: :class:`PersistingL2`, what ``check --json``
prints of it, is torch-free for ``schema``.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from pydantic import Field, NonNegativeInt

from .._text import shown
from ._json_output import Output

if TYPE_CHECKING:
    import torch


class PersistingL2(Output):
    """The device's persisting-L2 carve-out: information, never a fault."""

    applicable: bool = Field(description="False off CUDA.")
    bytes: NonNegativeInt | None = Field(description="The carve-out, or null when not read.")
    via: str | None = Field(
        default=None, description="What read it, or why it was not read; null off CUDA."
    )
    fault: str | None = Field(
        default=None, description="A figure outside 0..L2, refused; else null."
    )


LIMIT = 0x06
"""``cudaLimitPersistingL2CacheSize`` in the CUDA runtime's ``cudaLimit`` enum."""


def persisting_l2_bytes(device: torch.device) -> tuple[int | None, str]:
    """The carve-out's bytes on ``device`` in this process, and how they were read.

    The limit is the CUDA context's: a server that sets it itself (or an MPS
    server's default) holds its own value. ``None`` when neither reader works;
    the text then says why.
    """
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        torch.cuda.synchronize(index)  # the context exists before the runtime is asked
        try:
            return _via_cuda_bindings(index), "cuda-bindings"
        except (ImportError, RuntimeError) as bindings_error:
            try:
                return _via_libcudart(), "libcudart"
            except (OSError, RuntimeError) as ctypes_error:
                return None, f"cuda-bindings: {bindings_error}; libcudart: {ctypes_error}"


def _via_cuda_bindings(index: int) -> int:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart  # cuda-python before 12.6
    # A release whose calls answer in another shape is a reader that does not work here
    # (RuntimeError: the caller tries libcudart), never a traceback.
    answer: Any = None
    try:
        success = cudart.cudaError_t.cudaSuccess
        answer = cudart.cudaSetDevice(index)
        (error,) = answer
        if error != success:
            raise RuntimeError(f"cudaSetDevice: {error}")
        answer = cudart.cudaDeviceGetLimit(cudart.cudaLimit.cudaLimitPersistingL2CacheSize)
        error, value = answer
        if error != success:
            raise RuntimeError(f"cudaDeviceGetLimit: {error}")
        return int(value)
    except (AttributeError, TypeError, ValueError) as unexpected:
        raise RuntimeError(
            f"cuda-bindings answered {shown(repr(answer), 80)} "
            f"({type(unexpected).__name__}: {shown(str(unexpected), 120)}), not (error, value)"
        ) from None


def _via_libcudart() -> int:
    library: Any = None
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            library = ctypes.CDLL(name)  # torch's, already loaded, matches by soname
            break
        except OSError:
            continue
    if library is None:
        raise OSError("no libcudart.so.13/.12 loadable")
    value = ctypes.c_size_t(0)
    status = library.cudaDeviceGetLimit(ctypes.byref(value), ctypes.c_int(LIMIT))
    if status != 0:
        raise RuntimeError(f"cudaDeviceGetLimit returned {status}")
    return int(value.value)


ACT = (
    "act only if the server marks lines persisting and wants its races cold: "
    "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0) and cudaCtxResetPersistingL2Cache() "
    "in the server before start-up"
)
"""When an operator would act on a set-aside above 0 bytes, and how."""


def persisting_l2_line(
    device: torch.device, l2_cache_bytes: int | None = None
) -> tuple[str, PersistingL2]:
    """The report line about the carve-out, and its figures: information, never a verdict.

    A figure outside ``0..l2_cache_bytes`` (a negative limit, or more than the
    device's L2) is no set-aside but a device or driver fault: it is refused
    (``bytes`` None, ``fault`` says what was answered), never printed as bytes.
    """
    if device.type != "cuda":
        line = f"persisting L2: not applicable on {device} (a CUDA carve-out)"
        return line, PersistingL2(applicable=False, bytes=None)
    nbytes, via = persisting_l2_bytes(device)
    if nbytes is None:
        return f"persisting L2 carve-out: not read ({via})", PersistingL2(
            applicable=True, bytes=None, via=via
        )
    top = l2_cache_bytes if l2_cache_bytes is not None else 1 << 40
    if not 0 <= nbytes <= top:
        fault = f"cudaDeviceGetLimit answered {nbytes} via {via}"
        return (
            f"persisting L2 carve-out: not read: {fault}, outside 0..{top:,} bytes (the L2): a "
            "device or driver fault, not a set-aside; fix: check the driver (nvidia-smi) and "
            "run check in a fresh process",
            PersistingL2(applicable=True, bytes=None, via=via, fault=fault),
        )
    figures = PersistingL2(applicable=True, bytes=nbytes, via=via)
    where = f"{nbytes:,} bytes (cudaLimitPersistingL2CacheSize, read via {via})"
    if nbytes == 0:
        return f"persisting L2 carve-out: {where}: every L2 line can be evicted", figures
    return (
        f"persisting L2 carve-out: {where} set aside (information, not a fault): only lines "
        "a kernel marks persisting are held there, and they survive stock's eviction and the "
        f"plugin's read alike; {ACT}",
        figures,
    )
