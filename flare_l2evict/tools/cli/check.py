"""``flare-l2evict check``: the preflight an operator runs before turning the plugin on.

Start-up's own steps, nothing installed (:mod:`flare_l2evict.tools._preflight`), then the
verdict: one line per step, each within 100 columns with its detail on indented lines
under it, each fact once; or with ``--json`` one :class:`~._outputs.CheckOutput`. Without this
rank's checkpoint the verdict names the condition it could not check, never a plain
``installs``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..._errors import L2EvictError
from ..._text import shown
from .. import _signals
from ._shared import (
    EXIT_FALLS_BACK,
    EXIT_INSTALLS,
    USAGE_ERROR,
    Command,
    Exits,
    Listed,
    Parser,
    add_config_flag,
    add_profile_flags,
    device_text,
    log_steps,
    missing_driver,
    profile_of,
    refuse_cuda_without_driver,
    usable_device,
)

if TYPE_CHECKING:
    import torch
    from pydantic import BaseModel

    from ..._settings import L2EvictSettings
    from .._headers import TensorHeader
    from .._inputs import ConfigFound
    from .._profiles import DeviceProfile
    from .._races_check import RaceAgreement


_NO_RACES = (
    "--races runs b12x's races on a CUDA device, and there is none here{}; "
    "fix: run it on the GPU machine, or drop --races"
)


def _arguments(parser: Parser, _commands: Sequence[Listed]) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="*",
        type=Path,
        metavar="CHECKPOINT",
        help="this rank's .safetensors files and/or index (headers only are read)",
    )
    parser.add_argument(
        "--device",
        type=device_text,
        metavar="cpu|cuda:N",
        help="cpu or cuda:N (default: cuda:0 when CUDA is available, else cpu with the profile)",
    )
    add_config_flag(parser)
    add_profile_flags(parser, memory=True)
    parser.add_argument("--json", action="store_true", help="print one JSON object of every figure")
    parser.add_argument(
        "--races",
        action="store_true",
        help="on a GPU: also run a small set of real b12x races, stock against the plugin, "
        "and compare their winners and memory (about a minute)",
    )


def _run(args: argparse.Namespace) -> int:
    from .._headers import read_checkpoint, refuse_non_safetensors
    from .._inputs import read_deployment

    # Every input is read before torch is imported and before the first line: bad input is
    # one line on stderr and nothing on stdout, in under a second.
    deployment = read_deployment(args.config)
    refuse_non_safetensors(args.checkpoint)
    headers = read_checkpoint(list(args.checkpoint)) if args.checkpoint else None
    if args.races and args.device is not None and not args.device.startswith("cuda"):
        raise L2EvictError(
            f"--races runs b12x's races on a CUDA device (--device {args.device} given); "
            "fix: drop --device, or name cuda:N"
        )
    if args.races and (missing := missing_driver()) is not None:
        raise L2EvictError(_NO_RACES.format(f" ({missing})"))
    if args.device is not None:
        refuse_cuda_without_driver(args.device)
        device, reason = args.device, "--device"
    else:
        import torch

        # On a GPU server the question is the GPU; a CPU profile there would mislead.
        if torch.cuda.is_available():
            device, reason = "cuda:0", "default: CUDA is available here"
        elif args.races:
            raise L2EvictError(_NO_RACES.format(""))
        else:
            device = "cpu"
            reason = f"default: no CUDA device here, so profile {args.profile} stands in"
    return run_check(
        device=usable_device(device),
        device_reason=reason,
        profile=profile_of(args),
        settings=deployment.settings,
        config=deployment.found,
        headers=headers,
        as_json=args.json,
        races=args.races,
    )


def run_check(
    *,
    device: torch.device,
    device_reason: str,
    profile: DeviceProfile,
    settings: L2EvictSettings | None = None,
    config: ConfigFound | None = None,
    headers: list[TensorHeader] | None = None,
    as_json: bool = False,
    races: bool = False,
) -> int:
    """Print the preflight (or, ``as_json``, one :class:`CheckOutput`); return the exit code.

    0 if the plugin would install and credit (without ``headers``: if this rank's weights
    meet the condition the verdict names), or is disabled by config; 1 if it would fall
    back, or, with ``races`` (CUDA only), changed more race winners than stock's re-run.
    ``device_reason`` says why this device was checked; the first line says it.
    ``profile`` gives the race jobs, and L2 and memory off CUDA; ``settings`` the config's
    section, and ``config`` where it came from (default: none given, defaults apply).
    """
    from ..._clock import Clock
    from ..._settings import DISABLED, L2EvictSettings
    from .._inputs import ConfigFound
    from .._json_output import printed
    from .._preflight import Lines, basis, memory_bytes, provider, storage_and_credit
    from .._triton_check import triton_seam
    from ._outputs import CheckOutput
    from ._shared import own_version

    settings = L2EvictSettings() if settings is None else settings
    config = ConfigFound(file=None, found=False, keys=0) if config is None else config
    lines = Lines(quiet=as_json)
    own = own_version()
    lines.line(f"flare-l2evict {own} check on {device} ({device_reason})")
    lines.line(config.line(), whole=config.whole())
    steps = Clock()
    with steps.step("provider"):
        found = provider(lines)
    with steps.step("basis"):
        measured = basis(lines, device, profile, settings)
    with steps.step("triton"):
        seam = triton_seam(lines, device, measured.basis.l2_cache_bytes, settings, measured.blocked)
    blocked = measured.blocked if settings.enabled else DISABLED
    with steps.step("decision"):
        memory = memory_bytes(device, profile)
        decided = storage_and_credit(lines, headers, settings, measured, blocked, memory)
    granted = decided.credit
    if not races:  # the verdict states the result: from its line on, the run ends with its code
        _signals.settled()
    if not settings.enabled:
        # The operator's choice, not a fault: stock b12x, and nothing to act on.
        verdict: Literal["installs", "installs if", "falls back", "disabled"] = "disabled"
        lines.because("verdict: disabled by config, credit 0 bytes (stock b12x)", DISABLED)
    elif granted.nbytes == 0:
        verdict = "falls back"
        lines.because("verdict: falls back, credit 0 bytes", shown(_reason(granted.reason), 600))
    elif decided.condition is not None:
        # Never an unqualified "installs" for what was not checked: the storage is the rank's.
        verdict = "installs if"
        lines.line(
            f"verdict: installs only if this rank's weights cover the window; credit "
            f"{granted.nbytes:,} bytes",
            f"not checked: {decided.condition}; fix: pass this rank's checkpoint files to check it",
        )
    else:
        verdict = "installs"
        lines.line(
            f"verdict: installs; credit {granted.nbytes:,} bytes",
            f"{measured.basis.race_jobs} race jobs x {measured.basis.stock.nbytes:,} bytes, "
            "less the eviction's own outputs and kernel code",
        )
    agreed: RaceAgreement | None = None
    if races:
        from .._races_check import race_check

        with steps.step("races"):
            agreed = race_check(device, settings, lines.line)
    falls_back = verdict == "falls back" or (agreed is not None and not agreed.agrees)
    code: Literal[0, 1] = EXIT_FALLS_BACK if falls_back else EXIT_INSTALLS
    log_steps("check", steps.seconds)
    output = CheckOutput(
        device=str(device),
        device_reason=device_reason,
        flare_l2evict=own,
        config=config,
        versions=found.versions,
        b12x=found.b12x,
        supported=found.supported,
        l2_cache_bytes=measured.basis.l2_cache_bytes,
        l2_source=measured.l2_source,
        race_jobs=profile.race_jobs,
        persisting_l2=measured.persisting_l2,
        seam=measured.seam,
        triton=seam,
        stock_buffer=measured.stock_buffer,
        window=measured.window,
        storage_read=decided.storage_read,
        verdict=verdict,
        condition=decided.condition,
        credit_bytes=granted.nbytes,
        reason=None if granted.nbytes else _reason(granted.reason),
        races=agreed,
        exit_code=code,
    )
    _signals.settled()  # with --races, the races' line was the last to decide it
    if as_json:
        print(printed(output))
    return output.exit_code


def _output() -> type[BaseModel]:
    from ._outputs import CheckOutput

    return CheckOutput


def _reason(reason: str | None) -> str:
    return reason or "nothing to credit"


COMMAND = Command(
    name="check",
    help="preflight on the serving machine: would the plugin install, and what would it "
    "credit (exit 0 installs, or installs only if the condition it names holds, without "
    "a checkpoint; 1 falls back; 2 bad input)",
    example="check model.safetensors --config deploy.toml",
    exits=Exits(
        "the plugin would install and credit, or is disabled by config; without a "
        "CHECKPOINT: it would, if this rank's weights meet the condition the verdict names "
        "(verdict 'installs only if', not checked)",
        "it would fall back (the reason is under the verdict); with --races, also: the "
        "plugin changed more race winners than stock's own re-run did",
        USAGE_ERROR + "; with --races: no CUDA device here",
    ),
    arguments=_arguments,
    run=_run,
    output=_output,
)
