"""Load a safetensors checkpoint onto a device, with one-line errors."""

from __future__ import annotations

from pathlib import Path

import torch

from ..._errors import CheckpointError
from .. import _signals
from .._inputs import missing_checkpoint


def load_checkpoint(path: str | Path, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of ``path`` on ``device``, each in an allocation of its own.

    That is what ``load_file(device="cuda")`` gives a GPU server. On a CPU,
    safetensors maps the file instead, and its tensors sit at file offsets that
    need not be float32-aligned; each is copied out, so a CPU start-up sees what
    a GPU's would. Raises :class:`CheckpointError` if the file is unreadable.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise missing_checkpoint(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory; fix: pass a single .safetensors file")
    if not path.is_file():  # /dev/zero, a FIFO: it exists, but reading it never ends
        raise CheckpointError(
            f"{path}: not a regular file (a FIFO or device); fix: pass a single .safetensors file"
        )
    try:
        # Held: safetensors' Rust calls back into torch, and turned a Ctrl-C there into
        # "ValueError: could not determine the shape of object type ...", a traceback.
        with _signals.held():
            loaded = load_file(path, device=str(device))
        if device.type == "cpu":
            return {name: tensor.clone() for name, tensor in loaded.items()}
        return loaded
    except SafetensorError as error:
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({error}); fix: re-export or re-download it"
        ) from None
    except MemoryError as error:  # the mmap of the file, refused (ulimit -v, overcommit)
        detail = " ".join(str(error).split())[:200] or "out of memory"
        raise CheckpointError(
            f"{path}: cannot map its {path.stat().st_size:,} bytes into memory ({detail}); "
            "fix: raise the address-space limit (ulimit -v) or free memory, or pass a smaller "
            "checkpoint"
        ) from None
    except (OSError, RuntimeError) as error:
        detail = " ".join(str(error).split())[:200]
        raise CheckpointError(f"{path}: cannot load onto {device} ({detail})") from None
