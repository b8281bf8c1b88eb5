"""``flare-l2evict``: the reference host's start-up, side by side without and with plugins."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import stat
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .._errors import CheckpointError, ConfigError, L2EvictError
from .._text import shown
from ._driver import missing_driver
from ._lines import one_line
from ._profiles import DEFAULT_KV_BYTES_PER_TOKEN, DEFAULT_PROFILE, PROFILES, DeviceProfile
from ._steps import log_steps
from ._units import GiB, MiB

if TYPE_CHECKING:  # the CLI parses its arguments before importing torch or any tool
    import torch

    from ._plan import Plan
    from .reference_host import StartupResult


LOGGER = "flare_l2evict"
"""The one logger the CLI routes to stderr: its own and the plugin's lines, no library's."""
log = logging.getLogger(f"{LOGGER}.tools.cli")


# Upper bounds that refuse a typo before it costs minutes or terabytes.
LIMITS = {
    "--l2-mib": 4096,
    "--race-jobs": 1024,
    "--memory-gib": 4096,
    "--kv-bytes-per-token": 1 << 24,
    "--tp": 1024,
    # A dim beyond a tensor's rank replicates it; no checkpoint has 64 dims.
    "--split-dim": 64,
}


def _size(value: int) -> str:
    if value % MiB == 0 and value < 16 * GiB:
        return f"{value // MiB:,} MiB"
    if value < GiB:
        return f"{value / MiB:,.1f} MiB"
    return f"{value / GiB:.2f} GiB"


def _bounded(flag: str, low: int = 1) -> Any:
    return whole_number_in(low, LIMITS[flag])


def whole_number_in(low: int, limit: int) -> Any:
    """An argparse ``type`` for a whole number in ``low..limit`` (the bench uses it too)."""

    def parse(text: str) -> int:
        # 30 characters hold any number in range; int() of a longer one only costs time.
        # ASCII digits only, as in a window's size: int() would read "９" too.
        try:
            value = int(text) if len(text) <= 30 and text.isascii() else None
        except ValueError:
            value = None
        if value is None and not _WHOLE.match(text):
            raise argparse.ArgumentTypeError(f"'{shown(text, 40)}' is not a whole number")
        if value is None or not low <= value <= limit:
            raise argparse.ArgumentTypeError(
                f"'{shown(text, 40)}' must be between {low} and {limit:,}"
            )
        return value

    return parse


_WHOLE = re.compile(r"^\s*[+-]?[0-9]+\s*$")
# ASCII digits, no leading zero, whole text: torch.device refuses "cuda:007", "cuda:٣" and a
# trailing newline ("$" would match before one), which a loose pattern let through to a traceback.
_DEVICE = re.compile(r"cpu|cuda(:(0|[1-9][0-9]{0,2}))?", re.ASCII)


def _device_text(text: str) -> str:
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"'{shown(text, 40)}' is not a device; use cpu, cuda or cuda:N"
        )
    return text


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one bounded line naming cause and fix, and exit 2.

    ``--help`` is argparse's own. argparse echoes a bad value whole, so the
    cause is cut before the fix is added: the fix always survives.
    """

    commands: Mapping[str, argparse.ArgumentParser]
    """Each command's parser by name (on the top-level parser): its errors name its --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: `--race-job 3` taken as `--race-jobs 3` today is a silent break
        # tomorrow, when a flag that shares the prefix is added. Subparsers are made by this
        # class too, so every command gets the same rules.
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if "required: command" in message:
            fix = (
                f"name a command: {', '.join(COMMANDS)} (flare-l2evict --help says what each does)"
            )
        else:
            fix = f"see {self.prog} --help"
        self.exit(2, one_line(f"error: {self.prog}: {shown(message, 600)}; fix: {fix}") + "\n")


def _device(text: str) -> torch.device:
    """The device named by --device, checked against this machine by torch.

    A machine with no GPU driver is refused before torch is imported, by
    :func:`_refuse_cuda_without_driver`.
    """
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as error:  # the pattern's check is first; torch has the word
        raise L2EvictError(
            f"--device {shown(text, 40)}: not a device torch knows ({shown(str(error), 200)}); "
            "fix: use cpu, cuda or cuda:N"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise L2EvictError(f"--device {text}: CUDA is not available here; fix: --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise L2EvictError(
                f"--device {text}: this machine has {torch.cuda.device_count()} CUDA devices; "
                f"fix: --device cuda:0..{torch.cuda.device_count() - 1}"
            )
    return device


def _refuse_cuda_without_driver(text: str) -> None:
    """Refuse ``cuda:N`` on a machine with no GPU driver, torch-free, in milliseconds."""
    if text.startswith("cuda") and (missing := missing_driver()) is not None:
        raise L2EvictError(
            f"--device {text}: CUDA is not available here ({missing}); fix: --device cpu"
        )


_NO_RACES = (
    "--races runs b12x's races on a CUDA device, and there is none here{}; "
    "fix: run it on the GPU machine, or drop --races"
)


def _add_profile_flags(
    parser: argparse.ArgumentParser, *, memory: bool = False, kv: bool = False
) -> None:
    """The profile's flags; ``memory`` and ``kv`` only where the command uses them."""
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        metavar="|".join(sorted(PROFILES)),
        help=f"device to stand in for on a CPU (default {DEFAULT_PROFILE}, the seed's machine)",
    )
    parser.add_argument(
        "--l2-mib", type=_bounded("--l2-mib"), metavar="M", help="override the profile's L2"
    )
    parser.add_argument(
        "--race-jobs",
        type=_bounded("--race-jobs", low=0),
        metavar="J",
        help="override the profile's race jobs, 0..1,024 as the host contract takes them",
    )
    if memory:
        parser.add_argument(
            "--memory-gib",
            type=_bounded("--memory-gib"),
            metavar="G",
            help="override the profile's memory",
        )
    if not kv:
        return
    parser.add_argument(
        "--kv-bytes-per-token",
        type=_bounded("--kv-bytes-per-token"),
        metavar="B",
        default=DEFAULT_KV_BYTES_PER_TOKEN,
        help=f"KV cache bytes per token (default {DEFAULT_KV_BYTES_PER_TOKEN}, the seed's ratio)",
    )


def _profile(args: argparse.Namespace) -> DeviceProfile:
    profile = PROFILES[args.profile]
    if args.l2_mib:
        profile = replace(profile, l2_cache_bytes=args.l2_mib * MiB)
    if args.race_jobs is not None:  # 0 is a value: a host that races nothing
        profile = replace(profile, race_jobs=args.race_jobs)
    if getattr(args, "memory_gib", None):
        profile = replace(profile, memory_bytes=args.memory_gib * GiB)
    return profile


_CONFIG_HELP = "deployment config (.toml, .yaml, .json)"
KV_SIZINGS = ("reserved", "measured")
"""The host contract's two KV-sizing styles (``runtime.kv_sizing``), the default first."""
COMMANDS = ("startup", "plan", "check", "example", "schema")
JSON_COMMANDS = ("startup", "plan", "check")
"""The commands with ``--json``, each of whose JSON Schema ``schema`` prints."""


def _own_version() -> str:
    """This package's installed version (its distribution record), torch-free."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flare-l2evict")
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        return "(not installed)"


def _parser() -> _Parser:
    parser = _Parser(
        prog="flare-l2evict",
        description="b12x start-up races evict L2 by reading resident weights; "
        "the KV cache gets the eviction buffers.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"flare-l2evict {_own_version()}",
        help="print flare-l2evict's version and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    parser.commands = commands.choices
    startup = commands.add_parser(
        "startup",
        help="run the reference host without and with plugins and compare the KV cache",
    )
    startup.add_argument(
        "checkpoint",
        nargs="*",
        type=Path,
        metavar="CHECKPOINT",
        help=".safetensors files and/or a model.safetensors.index.json, loaded as one "
        "checkpoint (default: the embedded example)",
    )
    startup.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="load this flare plugin (repeatable), e.g. --plugin l2evict",
    )
    startup.add_argument("--config", type=Path, metavar="FILE", help=_CONFIG_HELP)
    startup.add_argument(
        "--device",
        type=_device_text,
        default="cpu",
        metavar="cpu|cuda:N",
        help="cpu or cuda:N (default: cpu)",
    )
    _add_profile_flags(startup, memory=True, kv=True)
    startup.add_argument(
        "--kv-sizing",
        choices=KV_SIZINGS,
        default="reserved",
        metavar="|".join(KV_SIZINGS),
        help="how the reference host sizes its KV cache: reserved (default; stock's buffers set "
        "aside before the races, the credit added) or measured (from what the races held, "
        "measured after them; nothing credited)",
    )
    startup.add_argument("--json", action="store_true", help="print JSON instead of a table")

    plan = commands.add_parser(
        "plan",
        help="read safetensors headers only and show, per rank, what the plugin would reclaim",
    )
    plan.add_argument(
        "checkpoint",
        nargs="+",
        type=Path,
        metavar="CHECKPOINT",
        help=".safetensors files and/or a model.safetensors.index.json",
    )
    plan.add_argument(
        "--tp", type=_bounded("--tp"), default=1, metavar="N", help="tensor-parallel degree"
    )
    plan.add_argument(
        "--per-rank",
        action="store_true",
        help="each CHECKPOINT is one rank's pre-sharded file or index, in rank order",
    )
    plan.add_argument(
        "--split-dim",
        type=_bounded("--split-dim", low=0),
        default=0,
        metavar="D",
        help="for an unsharded checkpoint: the dim split evenly across ranks, 0..64 "
        "(default 0; a tensor with fewer dims is replicated)",
    )
    plan.add_argument("--config", type=Path, metavar="FILE", help=_CONFIG_HELP)
    _add_profile_flags(plan, kv=True)
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")

    check = commands.add_parser(
        "check",
        help="preflight on the serving machine: would the plugin install, and what would it "
        "credit (exit 0 installs, or installs only if the condition it names holds, without "
        "a checkpoint; 1 falls back; 2 bad input)",
    )
    check.add_argument(
        "checkpoint",
        nargs="*",
        type=Path,
        metavar="CHECKPOINT",
        help="this rank's .safetensors files and/or index (headers only are read)",
    )
    check.add_argument(
        "--device",
        type=_device_text,
        metavar="cpu|cuda:N",
        help="cpu or cuda:N (default: cuda:0 when CUDA is available, else cpu with the profile)",
    )
    check.add_argument("--config", type=Path, metavar="FILE", help=_CONFIG_HELP)
    _add_profile_flags(check, memory=True)
    check.add_argument("--json", action="store_true", help="print one JSON object of every figure")
    check.add_argument(
        "--races",
        action="store_true",
        help="on a GPU: also run a small set of real b12x races, stock against the plugin, "
        "and compare their winners and memory (about a minute)",
    )

    example = commands.add_parser(
        "example",
        help="write the embedded example (checkpoint three ways, configs, COMMANDS.md) to try "
        "the other commands on",
    )
    example.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory to write (made if missing)",
    )
    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of what startup, plan or check prints with --json",
    )
    schema.add_argument(
        "name",
        choices=JSON_COMMANDS,
        metavar="|".join(JSON_COMMANDS),
        help="the command whose --json output to describe",
    )
    for name, sub in commands.choices.items():
        _add_verbosity(sub)
        sub.epilog = _epilog(name)
    parser.epilog = (
        "example:\n  flare-l2evict startup --plugin l2evict\n\n"
        "exit codes (startup, plan, check; each command's --help says its own):\n"
        "  0  the plugin installs and credits, or is disabled by config\n"
        "  1  it falls back, on this device or on any rank\n"
        "  2  a usage or input error"
    )
    return parser


EXIT_INSTALLS, EXIT_FALLS_BACK, EXIT_USAGE = 0, 1, 2
"""One meaning per exit code, for startup, plan and check (``--help`` says it per command)."""

_USAGE_ERROR = "a usage or input error (one line on stderr: the cause and the fix)"
_EXAMPLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "startup": (
        "flare-l2evict startup --plugin l2evict --config deploy.toml model.safetensors",
        (
            "the plugin installed and credited, or is disabled by config (or no --plugin "
            "l2evict was named)",
            "it fell back: stock b12x, 0 bytes (its WARNING line says why)",
            _USAGE_ERROR,
        ),
    ),
    "plan": (
        "flare-l2evict plan model.safetensors.index.json --tp 2",
        (
            "every rank would credit, or the plugin is disabled by config",
            "a rank would fall back, so every rank credits 0 (its reason is under its row)",
            _USAGE_ERROR,
        ),
    ),
    "check": (
        "flare-l2evict check model.safetensors --config deploy.toml",
        (
            "the plugin would install and credit, or is disabled by config; without a "
            "CHECKPOINT: it would, if this rank's weights meet the condition the verdict names "
            "(verdict 'installs only if', not checked)",
            "it would fall back (the reason is under the verdict); with --races, also: the "
            "plugin changed more race winners than stock's own re-run did",
            _USAGE_ERROR + "; with --races: no CUDA device here",
        ),
    ),
    "example": (
        "flare-l2evict example --out example",
        ("the files were written", "(not used)", _USAGE_ERROR + "; nothing written"),
    ),
    "schema": (
        "flare-l2evict schema check",
        ("the schema was printed (JSON, on stdout)", "(not used)", _USAGE_ERROR),
    ),
}
"""Each command's ``--help`` tail: one example, and what exit 0, 1 and 2 mean."""


def _epilog(command: str) -> str:
    example, codes = _EXAMPLES[command]
    lines = ["example:", f"  {example}", "", "exit codes:"]
    for code, meaning in enumerate(codes):
        lines += textwrap.wrap(meaning, 78, initial_indent=f"  {code}  ", subsequent_indent="     ")
    return "\n".join(lines)


def _add_verbosity(parser: argparse.ArgumentParser) -> None:
    """``-q`` and ``-v`` on a command: the log's level (stdout never changes)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-q", "--quiet", action="store_true", help="log warnings and errors only (stderr)"
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log debug lines too: how the plugin decided, step by step (stderr)",
    )


def _eviction_cell(result: StartupResult) -> str:
    from .._credit import stock_buffer_bytes

    stock = stock_buffer_bytes(result.l2_cache_bytes)
    if _installed(result) and result.eviction_storage_bytes < stock:
        return f"{result.eviction_storage_bytes:,} B (reads weights)"
    if result.eviction_storage_bytes == 0:
        return "0"
    if result.eviction_storage_bytes == result.race_jobs * stock:
        return f"{result.race_jobs} x {_size(stock)}"
    return f"{result.eviction_storage_bytes:,} B"


def _budget_cell(result: StartupResult) -> str:
    return "out of memory" if result.out_of_memory else _size(result.kv_budget_bytes)


def _installed(result: StartupResult) -> bool:
    """The races read weights: credited, or kept for a host that sizes by measurement."""
    kept = result.report.unallocated_bytes if result.report is not None else 0
    return bool(result.reclaimed_bytes or kept)


def _winners(result: StartupResult) -> str:
    return ",".join(map(str, result.race_winners)) or "-"


def _table(
    header: str, before: StartupResult, after: StartupResult, label: str, *, disabled: bool
) -> str:
    measured = " (measured)" if after.eviction_measured else ""
    # enabled = false is the operator's choice, not a fallback: the words check and plan use.
    asked = after.reclaimed_bytes + after.credit_cut_bytes  # the report's own figure
    reclaimed = "0 B (disabled by config)" if disabled else f"{asked:,} B"
    rows = [
        ("", "without plugins", label),
        (f"L2 eviction storage{measured}", _eviction_cell(before), _eviction_cell(after)),
        ("Loaded", _size(before.loaded_bytes), _size(after.loaded_bytes)),
        ("KV cache budget", _budget_cell(before), _budget_cell(after)),
        ("KV tokens", f"{before.kv_tokens:,}", f"{after.kv_tokens:,}"),
        ("Reclaimed (report)", "-", reclaimed),
    ]
    if after.credit_cut_bytes:
        taken = after.reclaimed_bytes
        rows.append(("Credit taken", "-", f"{taken:,} B (free at the hook)"))
    if after.kv_sizing == "measured":
        # Credited nothing: the saving is in the budget, seen by measurement alone. The
        # report's figure of what the races no longer allocate shows where it came from.
        unallocated = after.report.unallocated_bytes if after.report is not None else 0
        rows.append(("Unallocated (report)", "-", f"{unallocated:,} B"))
    if after.eviction_measured:
        rows += [
            (
                "Race peak (measured)",
                _size(before.race_peak_bytes or 0),
                _size(after.race_peak_bytes or 0),
            ),
            ("Race winners", _winners(before), _winners(after)),
            (
                "Free after races (measured)",
                _size(before.free_after_races_bytes or 0),
                _size(after.free_after_races_bytes or 0),
            ),
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [*map(_wrapped, header.splitlines()), ""]
    lines += [f"{a:<{widths[0]}}   {b:>{widths[1]}}   {c:>{widths[2]}}" for a, b, c in rows]
    # The plugin's report and audit are its own log lines (stderr): printing them here
    # too would say each fact twice. The table says what only the host knows.
    for arm, result in (("without plugins", before), (label, after)):
        if result.out_of_memory:
            lines.append(_wrapped(f"note: {arm}: {result.out_of_memory}"))
    if after.credit_cut_bytes:
        lines.append(
            _wrapped(
                f"note: {label}: the credit asked {after.credit_cut_bytes:,} bytes more than "
                f"the {after.free_at_hook_bytes:,} bytes free on the device at the hook; the "
                "reference host took only what memory could back"
            )
        )
    if after.cute_guard_stand_in:
        lines.append(
            "\n".join(
                textwrap.wrap(
                    "note: the CuTe DSL is not installed, so b12x's no-compilation guard ran "
                    "with a stand-in for b12x._lib.compiler (it refuses every CuTe compile); its "
                    "Triton half was b12x's own",
                    WIDTH,
                )
            )
        )
    return "\n".join(lines)


def _startup(args: argparse.Namespace) -> int:
    from ._config_file import load_deployment_config
    from ._inputs import refuse_unknown_plugins, refuse_unreadable_checkpoint, settings_from_config

    # Every input is checked before torch is imported: a typo is answered in under a second.
    config: dict[str, Any] = load_deployment_config(args.config) if args.config else {}
    ours = "l2evict" in args.plugin
    # A bad section stops here, with its one-line message.
    enabled = settings_from_config(config).enabled if ours else False
    refuse_unknown_plugins(args.plugin)
    refuse_non_safetensors(args.checkpoint)
    refuse_unreadable_checkpoint(args.checkpoint)
    profile = _profile(args)
    _refuse_cuda_without_driver(args.device)
    device = _device(args.device)
    import torch

    from .._credit import stock_window_bytes
    from .reference_host import ReferenceHost, write_example_checkpoint

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
    with tempfile.TemporaryDirectory(prefix="flare-l2evict-") as scratch:
        checkpoint = args.checkpoint or [write_example_checkpoint(scratch, stock_window_bytes(l2))]
        before = ReferenceHost(plugins=(), **common).start(checkpoint)
        after = ReferenceHost(plugins=args.plugin, **common).start(checkpoint)
    if after.report is not None:
        log_steps(log, "startup's before_first_capture", after.report.seconds)
    # Fell back: asked for, enabled, and never installed (its WARNING line says why). A
    # measuring host is credited nothing by design: it installed if the races read weights.
    code = EXIT_FALLS_BACK if enabled and not _installed(after) else EXIT_INSTALLS
    if args.json:
        from ._json_models import dumped

        figures = {"without": before.as_dict(), "with": after.as_dict(), "exit_code": code}
        print(dumped("startup", figures))
        return code
    what = shown(" ".join(map(str, args.checkpoint))) if args.checkpoint else "embedded example"
    header = (
        f"flare-l2evict startup: {what} on {device}\nprofile {profile.name} "
        f"({_size(before.memory_bytes)}, L2 {_size(before.l2_cache_bytes)}, "
        f"{profile.race_jobs} race jobs); {args.kv_bytes_per_token} bytes per KV token"
    )
    if args.kv_sizing == "measured":
        held = "race peak" if device.type == "cuda" else "L2 eviction storage"
        header += f"\nKV cache sized by measurement after the races: memory - loaded - {held}"
    label = " ".join(f"--plugin {name}" for name in args.plugin) or "with no --plugin"
    print(_table(header, before, after, label, disabled=ours and not enabled))
    return code


def _plan(args: argparse.Namespace) -> int:
    from ._config_file import load_deployment_config
    from ._headers import read_checkpoint
    from ._inputs import settings_from_config
    from ._plan import make_plan, shard_of, split_evenly

    config: dict[str, Any] = load_deployment_config(args.config) if args.config else {}
    settings = settings_from_config(config)
    profile = _profile(args)
    refuse_non_safetensors(args.checkpoint)
    started = time.perf_counter()
    steps: dict[str, float] = {}
    if args.per_rank:
        if len(args.checkpoint) != args.tp:
            raise L2EvictError(
                f"--per-rank needs one checkpoint per rank: got {len(args.checkpoint)} for "
                f"--tp {args.tp}; fix: pass exactly {args.tp} files or indexes in rank order"
            )
        headers = [read_checkpoint([path]) for path in args.checkpoint]
        shards = [shard_of(tensors) for tensors in headers]
        estimate = None
    else:
        headers = [read_checkpoint(args.checkpoint)]
        shards, estimate = split_evenly(headers[0], args.tp, args.split_dim)
        if args.tp == 1:
            estimate = None
    steps["headers"] = time.perf_counter() - started
    plan = make_plan(
        shards,
        settings,
        tensors=sum(map(len, headers)),
        files=len({t.file for tensors in headers for t in tensors}),
        l2_cache_bytes=profile.l2_cache_bytes,
        race_jobs=profile.race_jobs,
        kv_bytes_per_token=args.kv_bytes_per_token,
        estimate=estimate,
    )
    elapsed = time.perf_counter() - started
    steps["decision"] = elapsed - steps["headers"]
    log_steps(log, "plan", {**steps, "total": elapsed})
    # The agreed figure is the minimum over ranks: 0 when any rank falls back.
    falls_back = settings.enabled and plan.agreed_reclaimed_bytes == 0
    code = EXIT_FALLS_BACK if falls_back else EXIT_INSTALLS
    if args.json:
        from ._json_models import dumped

        print(dumped("plan", {**plan.as_dict(), "seconds": round(elapsed, 4), "exit_code": code}))
        return code
    # The time to read headers is in --json ("seconds"): the table is the same every run.
    print(
        f"flare-l2evict plan: {plan.tensors:,} tensor{'s' * (plan.tensors != 1)} in "
        f"{plan.files:,} file{'s' * (plan.files != 1)}; TP{args.tp}"
    )
    print(
        f"profile {profile.name} (L2 {_size(profile.l2_cache_bytes)}, {profile.race_jobs} race "
        f"jobs); {args.kv_bytes_per_token} bytes per KV token"
    )
    if plan.estimate:
        print(_wrapped(plan.estimate))
    print()
    print(plan_table(plan))
    print()
    print(
        f"agreed across ranks (minimum): {plan.agreed_reclaimed_bytes:,} bytes = "
        f"{plan.agreed_kv_tokens_gained:,} KV tokens per rank"
    )
    return code


WIDTH = 100
"""Columns every line of a table the CLI prints fits in; detail goes under its row."""


def _wrapped(text: str, indent: str = "") -> str:
    return "\n".join(
        textwrap.wrap(
            text,
            WIDTH,
            initial_indent=indent,
            subsequent_indent=indent + ("  " if indent else ""),
            break_on_hyphens=False,
        )
    )


def plan_table(plan: Plan) -> str:
    """One row of figures per rank, each within :data:`WIDTH` columns, what it reads under it.

    Tensor names come from the files: escaped and cut (:data:`NAME_LIMIT`), so a
    newline or a bidi override in one cannot break or disguise the table, and
    wrapped under the row with the reason a rank falls back.
    """
    from ._inputs import DISABLED
    from ._plan import NAME_LIMIT

    header = ("rank", "storage", "window", "reclaimed B", "KV tokens gained")
    rows = [
        (
            str(r.rank),
            _size(r.storage_bytes) if r.storage_bytes else "-",
            _size(r.window_bytes),
            f"{r.reclaimed_bytes:,}",
            f"{r.kv_tokens_gained:,}",
        )
        for r in plan.ranks
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )

    lines = [line(header)]
    for r, row in zip(plan.ranks, rows, strict=True):
        lines.append(line(row))
        if r.tensor:
            detail = f"reads {shown(r.tensor, NAME_LIMIT)}"
            if len(r.sources) > 1:
                detail += f" and {len(r.sources) - 1:,} more storages"
        elif r.reason == DISABLED:  # the operator's choice, not a fallback (check's words)
            detail = DISABLED
        else:
            detail = f"falls back: {shown(r.reason or '', 300)}"
        lines.append(_wrapped(detail, "      "))
    return "\n".join(lines)


def _example(args: argparse.Namespace) -> int:
    from .._credit import stock_window_bytes
    from ._example import write_example

    if args.out.exists() and not args.out.is_dir():
        raise L2EvictError(
            f"--out {shown(str(args.out))}: not a directory; fix: name a new or existing directory"
        )
    # Sized for the largest stock window of any profile (gb202's), so one example serves
    # every profile and a GPU's own L2 alike.
    profile = PROFILES[DEFAULT_PROFILE]
    try:
        written = write_example(args.out, stock_window_bytes(profile.l2_cache_bytes))
    except KeyboardInterrupt:  # write_example put DIR back as it was before it re-raised
        _error(
            "example",
            f"interrupted; nothing written to {shown(str(args.out))}",
            "run the command again",
        )
        return 130
    print(
        _wrapped(
            f"wrote {len(written)} files to {shown(str(args.out))} (the embedded example; "
            "checkpoints are sparse files of zeros that take no disk): "
            + ", ".join(path.name for path in written)
        )
    )
    print(f"commands to try: {shown(str(args.out / 'COMMANDS.md'))}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ._config_file import load_deployment_config
    from ._headers import read_checkpoint
    from ._inputs import settings_from_config

    # Every input is read before torch is imported: bad input is one line, in under a second.
    deployment: dict[str, Any] = load_deployment_config(args.config) if args.config else {}
    settings = settings_from_config(deployment)
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
        _refuse_cuda_without_driver(args.device)
    from ._check import run_check

    if args.device is not None:
        reason = "--device"
    else:
        import torch

        # On a GPU server the question is the GPU; a CPU profile there would mislead.
        if torch.cuda.is_available():
            args.device, reason = "cuda:0", "default: CUDA is available here"
        elif args.races:
            raise L2EvictError(_NO_RACES.format(""))
        else:
            args.device = "cpu"
            reason = f"default: no CUDA device here, so profile {args.profile} stands in"
    return run_check(
        device=_device(args.device),
        device_reason=reason,
        profile=_profile(args),
        settings=settings,
        headers=headers,
        as_json=args.json,
        races=args.races,
    )


def _schema(args: argparse.Namespace) -> int:
    from ._json_models import json_schema

    print(json.dumps(json_schema(args.name), indent=2))
    return 0


def _terminate(signum: int, _frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C, so temporary checkpoints are removed on the way out.
    raise KeyboardInterrupt(signum)


_FIX = "; fix: "
_DEFAULT_FIX: tuple[tuple[type[Exception], str], ...] = (
    (ConfigError, "correct the config file at the line or key named"),
    (CheckpointError, "pass .safetensors files or a model.safetensors.index.json"),
)


def error_line(command: str, cause: str, fix: str | None = None) -> str:
    """``error: flare-l2evict CMD: <cause>; fix: <fix>``: every CLI error, one line of <= 1 KB.

    A cause that carries its own ``; fix: ...`` keeps it; else ``fix`` is used.
    The cause is cut before the fix is added, so the fix always survives.
    """
    cause, found, own_fix = cause.partition(_FIX)
    fix = own_fix if found else (fix or f"see flare-l2evict {command} --help")
    return one_line(f"error: flare-l2evict {command}: {shown(cause, 600)}{_FIX}{shown(fix, 300)}")


def _error(command: str, cause: str, fix: str | None = None) -> None:
    """The CLI's last guard: whatever an error carries, one line on stderr."""
    print(error_line(command, cause, fix), file=sys.stderr)


_RAISED = "and on_error = 'raise': "
"""What start-up's error says when ``on_error = "raise"`` turned a fallback into an abort."""
RAISED_FIX = (
    'set on_error = "fallback" in the config\'s [plugins.l2evict] section (start-up then '
    "keeps stock b12x and credits 0 instead of aborting)"
)
"""The fix of an abort under ``on_error = "raise"`` whose cause names no fix of its own."""


def _fix_for(error: Exception) -> str | None:
    if _RAISED in str(error):  # the cause's own fix, if it has one, still comes first
        return RAISED_FIX
    return next((fix for kind, fix in _DEFAULT_FIX if isinstance(error, kind)), None)


def refuse_non_safetensors(paths: Sequence[Path]) -> None:
    """Refuse, by name, a file that plainly is not safetensors (text or JSON, not an index).

    A safetensors file starts with its header's length, 8 little-endian bytes;
    8 bytes of printable text declare over 2**56 header bytes, which no file
    has. So text there is never a checkpoint, and a JSON file is most likely
    an index not named ``*.index.json`` (only that name is read as an index):
    telling the operator to re-download it would send them after a good file.
    Files that cannot be opened are left to the reader's own messages.
    """
    for path in paths:
        if path.name.endswith(".index.json"):
            continue
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
                continue
            with path.open("rb") as handle:
                head = handle.read(8)
        except (OSError, ValueError):  # ValueError: a NUL inside the path
            continue
        if not head or not all(byte in _TEXT_BYTES for byte in head):
            continue
        where = shown(str(path))
        if head.lstrip().startswith((b"{", b"[")):
            raise CheckpointError(
                f"{where}: a JSON file, not a safetensors file (an index is read as one only "
                "when its name ends in .index.json); fix: pass the checkpoint's .safetensors "
                "files, or its model.safetensors.index.json"
            )
        raise CheckpointError(
            f"{where}: a text file, not a safetensors file (it starts with "
            f"'{shown(head.decode('ascii'), 20)}'); fix: pass .safetensors files or a "
            "model.safetensors.index.json"
        )


_TEXT_BYTES = frozenset(range(0x20, 0x7F)) | frozenset(b"\t\n\r\f\v")


def _route_log(level: int) -> Callable[[], None]:
    """:data:`LOGGER`'s lines at ``level`` and above to stderr; returns the undo.

    Only this package's logger, not the root: a library's own INFO lines (torch's
    ``FakeTensor cache stats`` at exit) are not the operator's. It does not
    propagate meanwhile, so a library that configured the root logger cannot
    print each line twice. The undo leaves the logger as it was, for a program
    that calls :func:`main` in-process.
    """
    logger = logging.getLogger(LOGGER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    was = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False

    def unroute() -> None:
        logger.removeHandler(handler)
        logger.setLevel(was[0])
        logger.propagate = was[1]

    return unroute


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would blame the top-level parser; the command's --help lists its flags
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    level = (
        logging.WARNING
        if getattr(args, "quiet", False)
        else logging.DEBUG
        if getattr(args, "verbose", False)
        else logging.INFO
    )
    unroute = _route_log(level)
    commands = {
        "startup": _startup,
        "plan": _plan,
        "check": _check,
        "example": _example,
        "schema": _schema,
    }
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return commands[args.command](args)
    except L2EvictError as error:
        _error(args.command, str(error), _fix_for(error))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error(args.command, "interrupted; temporary files removed", "run the command again")
        return 130
    except OSError as error:
        _error(
            args.command,
            f"{error.strerror or error} ({shown(str(error.filename or 'no file'))})",
            "check the path and its permissions",
        )
        return EXIT_USAGE
    finally:
        signal.signal(signal.SIGTERM, previous)
        unroute()
