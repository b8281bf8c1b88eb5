"""``check``'s Triton step: the Triton seam beside b12x's, as a start-up would judge it.

Unlike the plugin at start-up (which serves Triton only where the host imported it),
``check`` is an operator's fresh process: it imports Triton where it is installed, to
run the same seam proof (:func:`~flare_l2evict._triton.proof.prove_triton`). Off CUDA the
proof cannot make an active driver, so the release table alone judges it there, and the
line says so. A broken Triton is one line, never a traceback. Imported by ``check`` only
after its inputs are read: ``--help`` and usage errors never load it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field, NonNegativeInt

from .._b12x.provider import installed_version
from .._errors import L2EvictError
from .._report import TRITON_STOCK_BYTES
from .._settings import DISABLED, TRITON_DISABLED, L2EvictSettings
from .._text import described, shown
from .._triton.proof import STOCK, Verdict, prove_triton
from .._triton.table import judged
from ._json_output import Output

if TYPE_CHECKING:
    import torch

    from ._preflight import Lines

NO_DRIVER = "Triton has no active driver"
"""How the proof's reason starts where no GPU could make Triton's driver."""

_STOCK_BYTES = f"{TRITON_STOCK_BYTES:,}"


class CheckTriton(Output):
    """Triton's ``do_bench`` flush: whether a start-up would serve it from the weights."""

    version: str | None = Field(description="triton's version, or null when not installed.")
    judged: Literal["installs", "stays stock"] | None = Field(
        description="The judged Triton release table's verdict; null when it has no row."
    )
    would_install: bool = Field(
        description="True: on this device, do_bench's flush would read the weights, then zero "
        "the scratch (the seam proof passed here), where the server imports triton before "
        "before_first_capture; false: it stays stock (reason says why)."
    )
    reason: str | None = Field(description="Why it stays stock, or null.")
    scratch_bytes: NonNegativeInt = Field(
        description="Bytes one do_bench call would allocate for its flush with the plugin "
        f"(stock: {_STOCK_BYTES}); 0 when it stays stock."
    )


@dataclass(frozen=True)
class _Found:
    version: str | None
    verdict: Verdict


def _found() -> _Found:
    """The proof on the Triton installed here (importing it), and its version."""
    try:
        verdict = prove_triton()
    except Exception as error:  # a Triton of a shape the proof never met: one line
        verdict = Verdict(None, f"proving Triton's seam raised {described(error, 200)}; {STOCK}")
    version = verdict.proof.version if verdict.proof is not None else None
    if version is None:
        loaded = sys.modules.get("triton")
        found = getattr(loaded, "__version__", None) if loaded is not None else None
        version = str(found) if isinstance(found, str) else installed_version("triton")
    return _Found(version, verdict)


def _stock(reason: str) -> str:
    return reason if STOCK in reason else f"{reason}; {STOCK}"


def triton_seam(
    lines: Lines,
    device: torch.device,
    l2_cache_bytes: int,
    settings: L2EvictSettings,
    blocked: str | None,
) -> CheckTriton:
    """The Triton line, and ``check --json``'s ``triton``: ``blocked`` is why b12x's seam falls
    back (Triton's flush is served only beside its install), or ``None``."""
    from .._triton.flush import scratch_bytes
    from .._triton.wing import SCRATCH_FACTOR, SERVED_DEVICES

    if not settings.enabled or not settings.triton:
        key = "triton" if settings.enabled else "enabled"
        lines.line(f"triton: disabled by config ({key} = false)")
        why = _stock(TRITON_DISABLED if settings.enabled else DISABLED)
        return CheckTriton(
            version=None, judged=None, would_install=False, reason=why, scratch_bytes=0
        )
    found = _found()
    if found.version is None and found.verdict.reason.startswith("triton is not installed"):
        lines.line(f"triton: not installed: {STOCK}")
        return CheckTriton(
            version=None,
            judged=None,
            would_install=False,
            reason=_stock(found.verdict.reason),
            scratch_bytes=0,
        )
    try:
        row = judged(found.version) if found.version is not None else None
    except L2EvictError as error:  # the shipped table unreadable: its own one line
        row, table = None, f"judged table unreadable ({shown(str(error), 200)})"
    else:
        table = (
            "not in the judged table"
            if row is None
            else f"judged table: {'installs' if row.installs else 'stays stock'}"
        )
    verdict: Literal["installs", "stays stock"] | None = None
    if row is not None:
        verdict = "installs" if row.installs else "stays stock"
    head = f"triton: {found.version or 'version unknown'}; {table}"
    scratch = scratch_bytes(l2_cache_bytes, SCRATCH_FACTOR)
    reads = "do_bench's flush would read the weights"
    zeroes = f"then zero a scratch of {scratch:,} bytes per call (stock: {_STOCK_BYTES})"
    serves = f"{reads}, {zeroes}"
    proof, reason = found.verdict.proof, found.verdict.reason
    served = device.type in SERVED_DEVICES
    if proof is not None and served and blocked is None:
        # Start-up serves only a Triton the server imported before the hook; check imported it.
        lines.line(f"{head}; {reads}", f"{zeroes}, if the server imports triton before the hook")
        return CheckTriton(
            version=found.version,
            judged=verdict,
            would_install=True,
            reason=None,
            scratch_bytes=scratch,
        )
    if proof is None and not reason.startswith(NO_DRIVER):
        why = reason
    elif not served:
        # No driver here, or weights off CUDA: what this release does on a CUDA device is the
        # table's verdict (or, with the driver made, the proof's).
        if proof is not None or (row is not None and row.installs):
            on_cuda = f"on a CUDA device, {serves}"
        elif row is not None:
            on_cuda = f"on a CUDA device it stays stock too ({row.reason})"
        else:
            on_cuda = "on a CUDA device the seam proof judges it"
        basis = "the seam proof ran" if proof is not None else "judged by the table only"
        why = f"{device} is not a CUDA device ({basis}): {on_cuda}"
    elif blocked is not None:
        why = "b12x's seam falls back (above): Triton's flush is served only beside its install"
    else:
        why = reason
    why = _stock(why)
    lines.line(f"{head}; {STOCK}", shown(why, 600))
    return CheckTriton(
        version=found.version, judged=verdict, would_install=False, reason=why, scratch_bytes=0
    )
