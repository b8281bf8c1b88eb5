"""Load a safetensors checkpoint onto a device, with one-line errors."""

from __future__ import annotations

from pathlib import Path

import torch

from ..._errors import CheckpointError


def load_checkpoint(path: str | Path, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of ``path`` on ``device``; :class:`CheckpointError` if unreadable."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise CheckpointError(
            f"{path}: no such checkpoint; fix: pass a .safetensors file, or none for the "
            "embedded example"
        )
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file; fix: pass a single .safetensors file")
    try:
        return load_file(path, device=str(device))
    except SafetensorError as error:
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({error}); fix: re-export or re-download it"
        ) from None
    except (OSError, RuntimeError) as error:
        detail = " ".join(str(error).split())[:200]
        raise CheckpointError(f"{path}: cannot load onto {device} ({detail})") from None
