"""``flare-l2evict startup``: the reference host's start-up without and with plugins, compared."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..._text import shown
from ._shared import (
    EXIT_FALLS_BACK,
    EXIT_INSTALLS,
    Command,
    Exits,
    Listed,
    Parser,
    add_config_flag,
    add_profile_flags,
    device_text,
    log,
    log_steps,
    profile_of,
    refuse_cuda_without_driver,
    size_text,
    step,
    usable_device,
    wrapped,
)

if TYPE_CHECKING:
    import torch
    from pydantic import BaseModel

    from .._startup_arm import StartupArm

KV_SIZINGS = ("reserved", "measured")
"""The host contract's two KV-sizing styles (``runtime.kv_sizing``), the default first."""


def _arguments(parser: Parser, _commands: Sequence[Listed]) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="*",
        type=Path,
        metavar="CHECKPOINT",
        help=".safetensors files and/or a model.safetensors.index.json, loaded as one "
        "checkpoint (default: the embedded example)",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="load this flare plugin (repeatable), e.g. --plugin l2evict",
    )
    add_config_flag(parser)
    parser.add_argument(
        "--device",
        type=device_text,
        default="cpu",
        metavar="cpu|cuda:N",
        help="cpu or cuda:N (default: cpu)",
    )
    add_profile_flags(parser, memory=True, kv=True)
    parser.add_argument(
        "--kv-sizing",
        choices=KV_SIZINGS,
        default="reserved",
        metavar="|".join(KV_SIZINGS),
        help="how the reference host sizes its KV cache: reserved (default; stock's buffers set "
        "aside before the races, the credit added) or measured (from what the races held, "
        "measured after them; nothing credited)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _run(args: argparse.Namespace) -> int:
    from .. import _signals
    from .._headers import refuse_non_safetensors
    from .._inputs import read_deployment, refuse_unknown_plugins, refuse_unreadable_checkpoint
    from .._json_output import printed
    from ._outputs import StartupOutput

    # Every input is checked before torch is imported: a typo is answered in under a second.
    # A bad section (or one named near [plugins.l2evict]) stops here, in one line.
    deployment = read_deployment(args.config)
    ours = "l2evict" in args.plugin
    enabled = deployment.settings.enabled if ours else False
    refuse_unknown_plugins(args.plugin)
    refuse_non_safetensors(args.checkpoint)
    refuse_unreadable_checkpoint(args.checkpoint)
    profile = profile_of(args)
    refuse_cuda_without_driver(args.device)
    device = usable_device(args.device)
    before, after = _start_ups(args, deployment.config, device)
    if after.report is not None:
        log_steps("startup's before_first_capture", after.report.seconds)
    # Fell back: asked for, enabled, and never installed (its WARNING line says why). A
    # measuring host is credited nothing by design: it installed if the races read weights.
    code: Literal[0, 1] = EXIT_FALLS_BACK if enabled and not after.installed else EXIT_INSTALLS
    _signals.settled()
    if args.json:
        output = StartupOutput.model_validate(
            {"config": deployment.found, "without": before, "with": after, "exit_code": code}
        )
        print(printed(output))
        return code
    what = shown(" ".join(map(str, args.checkpoint))) if args.checkpoint else "embedded example"
    header = (
        f"flare-l2evict startup: {what} on {device}\nprofile {profile.name} "
        f"({size_text(before.memory_bytes)}, L2 {size_text(before.l2_cache_bytes)}, "
        f"{profile.race_jobs} race jobs); {args.kv_bytes_per_token} bytes per KV token"
    )
    if args.config is not None:
        header += f"\n{deployment.found.line()}"
    if args.kv_sizing == "measured":
        held = "race peak" if device.type == "cuda" else "L2 eviction storage"
        header += f"\nKV cache sized by measurement after the races: memory - loaded - {held}"
    label = " ".join(f"--plugin {name}" for name in args.plugin) or "with no --plugin"
    whole = (*deployment.found.whole(), *(shown(str(path)) for path in args.checkpoint))
    disabled = ours and not enabled
    fell_back = code == EXIT_FALLS_BACK
    # The reference host times nothing with Triton: its row says what a do_bench call in
    # this process would allocate, so it is shown where the process imported Triton (or the
    # plugin served it), never as noise for a host that has no Triton.
    triton = "triton" in sys.modules
    print(
        table(
            header,
            before,
            after,
            label,
            disabled=disabled,
            fell_back=fell_back,
            whole=whole,
            triton=triton,
        )
    )
    return code


def _start_ups(
    args: argparse.Namespace, config: dict[str, Any], device: torch.device
) -> tuple[StartupArm, StartupArm]:
    """The reference host's start-up without plugins, then with the named ones."""
    import torch

    from ..._credit import stock_window_bytes
    from ..reference_host import ReferenceHost, write_example_checkpoint

    profile = profile_of(args)
    l2 = (
        torch.cuda.get_device_properties(device).L2_cache_size
        if device.type == "cuda"
        else profile.l2_cache_bytes
    )
    common: dict[str, Any] = {
        "config": config,
        "device": device,
        "profile": profile,
        "kv_bytes_per_token": args.kv_bytes_per_token,
        "kv_sizing": args.kv_sizing,
    }
    jobs = f"{profile.race_jobs:,} race job{'s' * (profile.race_jobs != 1)}"
    if device.type != "cuda":  # the plugin's own -v line calls it the caller's figure
        log.debug(
            "flare-l2evict startup: the %s profile stands in for the device: L2 %s bytes "
            "(passed as runtime.l2_cache_bytes), memory %s bytes",
            profile.name,
            f"{profile.l2_cache_bytes:,}",
            f"{profile.memory_bytes:,}",
        )
    label = " ".join(f"--plugin {name}" for name in args.plugin) or "with no --plugin"
    from .. import _signals

    with _signals.temporary_directory("flare-l2evict-") as scratch:
        if args.checkpoint:
            checkpoint = args.checkpoint
        else:
            step("startup", "writing the embedded example checkpoint (sparse) to a temporary dir")
            checkpoint = [write_example_checkpoint(scratch, stock_window_bytes(l2))]
        step("startup", f"without plugins: loading the checkpoint on {device}, then {jobs}")
        before = ReferenceHost(plugins=(), **common).start(checkpoint)
        step("startup", f"{label}: loading the checkpoint on {device}, then the hooks and {jobs}")
        after = ReferenceHost(plugins=args.plugin, **common).start(checkpoint)
    return before, after


def _eviction_cell(arm: StartupArm) -> str:
    from ..._credit import stock_buffer_bytes

    stock = stock_buffer_bytes(arm.l2_cache_bytes)
    if arm.installed and arm.eviction_storage_bytes < stock:
        return f"{arm.eviction_storage_bytes:,} B (reads weights)"
    if arm.eviction_storage_bytes == 0 and not arm.out_of_memory:
        return "0"
    if arm.eviction_storage_bytes == arm.race_jobs * stock or arm.out_of_memory:
        return f"{arm.race_jobs} x {size_text(stock)}"
    return f"{arm.eviction_storage_bytes:,} B"


def _triton_cell(arm: StartupArm) -> str:
    """What one ``do_bench`` call's flush allocates in this arm: the scratch, or stock's."""
    from ..._report import TRITON_STOCK_BYTES

    section = arm.report.triton if arm.report is not None else None
    if section is not None and section.installed:
        return f"{section.scratch_bytes:,} B (reads weights)"
    stock = size_text(TRITON_STOCK_BYTES)
    return stock if arm.report is None else f"{stock} (stock)"


def _budget_cell(arm: StartupArm) -> str:
    return "out of memory" if arm.out_of_memory else size_text(arm.kv_budget_bytes)


def _winners(arm: StartupArm) -> str:
    return ",".join(map(str, arm.race_winners)) or "-"


def table(
    header: str,
    before: StartupArm,
    after: StartupArm,
    label: str,
    *,
    disabled: bool,
    fell_back: bool = False,
    whole: Sequence[str] = (),
    triton: bool = False,
) -> str:
    """The seed's table: each figure without and with plugins, then the notes under it.

    The header's lines are wrapped, each of ``whole`` (a path) kept whole. ``fell_back``: the
    plugin was asked for, enabled, and fell back; a note under the table says why.
    ``triton``: the host imported Triton, so a row shows what one ``do_bench`` call's flush
    allocates (also shown where the plugin served it); a note says why it stayed stock."""
    measured = " (measured)" if after.eviction_measured else ""
    # enabled = false is the operator's choice, not a fallback: the words check and plan use.
    asked = after.reclaimed_bytes + after.credit_cut_bytes  # the report's own figure
    reclaimed = "0 B (disabled by config)" if disabled else f"{asked:,} B"
    rows = [
        ("", "without plugins", label),
        (f"L2 eviction storage{measured}", _eviction_cell(before), _eviction_cell(after)),
        ("Loaded", size_text(before.loaded_bytes), size_text(after.loaded_bytes)),
        ("KV cache budget", _budget_cell(before), _budget_cell(after)),
        ("KV tokens", f"{before.kv_tokens:,}", f"{after.kv_tokens:,}"),
        ("Reclaimed (report)", "-", reclaimed),
    ]
    served = after.report is not None and after.report.triton.installed
    if triton or served:
        # Beside b12x's eviction storage: both are what a flush would otherwise allocate.
        rows.insert(2, ("Triton flush per call", _triton_cell(before), _triton_cell(after)))
    if after.credit_cut_bytes:
        rows.append(("Credit taken", "-", f"{after.reclaimed_bytes:,} B (free at the hook)"))
    if after.kv_sizing == "measured":
        # Credited nothing: the saving is in the budget, seen by measurement alone. The
        # report's figure of what the races no longer allocate shows where it came from.
        unallocated = after.report.unallocated_bytes if after.report is not None else 0
        rows.append(("Unallocated (report)", "-", f"{unallocated:,} B"))
    if after.eviction_measured:
        rows += [
            (
                "Race peak (measured)",
                size_text(before.race_peak_bytes or 0),
                size_text(after.race_peak_bytes or 0),
            ),
            ("Race winners", _winners(before), _winners(after)),
            (
                "Free after races (measured)",
                size_text(before.free_after_races_bytes or 0),
                size_text(after.free_after_races_bytes or 0),
            ),
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [*(wrapped(line, whole=whole) for line in header.splitlines()), ""]
    lines += [f"{a:<{widths[0]}}   {b:>{widths[1]}}   {c:>{widths[2]}}" for a, b, c in rows]
    # The plugin's report and audit are its own log lines (stderr): printing them here
    # too would say each fact twice. The table says what only the host knows.
    notes = _notes(before, after, label, fell_back=fell_back)
    section = after.report.triton if after.report is not None else None
    if (triton or served) and section is not None and not section.installed:
        from ..._triton.proof import STOCK

        why = (section.reason or "no reason given").removesuffix(f"; {STOCK}")
        notes.append(wrapped(f"note: {label}: {STOCK}: {shown(why, 600)}"))
    return "\n".join([*lines, *notes])


def _notes(before: StartupArm, after: StartupArm, label: str, *, fell_back: bool) -> list[str]:
    notes = [
        f"note: {arm}: {result.out_of_memory}"
        for arm, result in (("without plugins", before), (label, after))
        if result.out_of_memory
    ]
    if fell_back and not after.out_of_memory:  # out of memory: the note above says why
        # The plugin's WARNING on stderr says it too; the table is what gets pasted.
        reason = after.report.reason if after.report is not None else None
        notes.append(
            f"note: {label}: fell back (stock b12x kept): "
            f"{shown(reason or 'no report came back; its log line on stderr says why', 600)}"
        )
    if after.credit_cut_bytes:
        notes.append(
            f"note: {label}: the credit asked {after.credit_cut_bytes:,} bytes more than the "
            f"{after.free_at_hook_bytes:,} bytes free on the device at the hook; the reference "
            "host took only what memory could back"
        )
    if after.cute_guard_stand_in:
        notes.append(
            "note: the CuTe DSL is not installed, so b12x's no-compilation guard ran with a "
            "stand-in for b12x._lib.compiler (it refuses every CuTe compile); its Triton half "
            "was b12x's own"
        )
    return [wrapped(note) for note in notes]


def _output() -> type[BaseModel]:
    from ._outputs import StartupOutput

    return StartupOutput


COMMAND = Command(
    name="startup",
    help="run the reference host without and with plugins and compare the KV cache",
    example="startup --plugin l2evict --config deploy.toml model.safetensors",
    exits=Exits(
        "the plugin installed and credited, or is disabled by config (or no --plugin "
        "l2evict was named)",
        "it fell back: stock b12x, 0 bytes (its WARNING line says why)",
    ),
    arguments=_arguments,
    run=_run,
    output=_output,
    # Without a CHECKPOINT it writes the embedded example to a temporary directory first.
    temporary=lambda args: not args.checkpoint,
)
