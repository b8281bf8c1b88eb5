"""``flare-l2evict plan``: per rank, what the plugin would read and reclaim, from headers alone."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..._errors import L2EvictError
from ..._text import shown
from .. import _signals
from ._shared import (
    EXIT_FALLS_BACK,
    EXIT_INSTALLS,
    Command,
    Exits,
    Listed,
    Parser,
    add_config_flag,
    add_profile_flags,
    log_steps,
    plural,
    profile_of,
    size_text,
    whole_number_in,
    wrapped,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .._plan import PlanRank


def _arguments(parser: Parser, _commands: Sequence[Listed]) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="+",
        type=Path,
        metavar="CHECKPOINT",
        help=".safetensors files and/or a model.safetensors.index.json",
    )
    parser.add_argument(
        "--tp", type=whole_number_in(1, 1024), default=1, metavar="N", help="tensor-parallel degree"
    )
    parser.add_argument(
        "--per-rank",
        action="store_true",
        help="each CHECKPOINT is one rank's pre-sharded file or index, in rank order",
    )
    parser.add_argument(
        "--split-dim",
        # A dim beyond a tensor's rank replicates it; no checkpoint has 64 dims.
        type=whole_number_in(0, 64),
        default=0,
        metavar="D",
        help="for an unsharded checkpoint: the dim split evenly across ranks, 0..64 "
        "(default 0; a tensor with fewer dims is replicated)",
    )
    add_config_flag(parser)
    add_profile_flags(parser, kv=True)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _run(args: argparse.Namespace) -> int:
    from .._headers import read_checkpoint, refuse_non_safetensors
    from .._inputs import read_deployment
    from .._json_output import printed
    from .._plan import kv_tokens, plan_ranks, shard_of, split_evenly
    from ._outputs import PlanOutput

    deployment = read_deployment(args.config)
    settings = deployment.settings
    profile = profile_of(args)
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
    ranks = plan_ranks(
        shards,
        settings,
        l2_cache_bytes=profile.l2_cache_bytes,
        race_jobs=profile.race_jobs,
        kv_bytes_per_token=args.kv_bytes_per_token,
    )
    elapsed = time.perf_counter() - started
    steps["decision"] = elapsed - steps["headers"]
    log_steps("plan", {**steps, "total": elapsed})
    # The agreed figure is the minimum over ranks: 0 when any rank falls back.
    agreed = min(rank.reclaimed_bytes for rank in ranks)
    code: Literal[0, 1] = EXIT_FALLS_BACK if settings.enabled and agreed == 0 else EXIT_INSTALLS
    output = PlanOutput(
        ranks=ranks,
        agreed_reclaimed_bytes=agreed,
        agreed_kv_tokens_gained=kv_tokens(agreed, args.kv_bytes_per_token),
        tensors=sum(map(len, headers)),
        files=len({t.file for tensors in headers for t in tensors}),
        estimate=estimate,
        config=deployment.found,
        seconds=round(elapsed, 4),
        exit_code=code,
    )
    _signals.settled()
    if args.json:
        print(printed(output))
        return output.exit_code
    # The time to read headers is in --json ("seconds"): the table is the same every run.
    print(
        f"flare-l2evict plan: {plural(output.tensors, 'tensor')} in "
        f"{plural(output.files, 'file')}; TP{args.tp}"
    )
    print(
        f"profile {profile.name} (L2 {size_text(profile.l2_cache_bytes)}, {profile.race_jobs} "
        f"race jobs); {args.kv_bytes_per_token} bytes per KV token"
    )
    if args.config is not None:
        print(wrapped(output.config.line(), whole=output.config.whole()))
    if output.estimate:
        print(wrapped(output.estimate))
    print()
    print(table(output.ranks))
    print()
    print(
        f"agreed across ranks (minimum): {output.agreed_reclaimed_bytes:,} bytes = "
        f"{output.agreed_kv_tokens_gained:,} KV tokens per rank"
    )
    return output.exit_code


def table(ranks: Sequence[PlanRank]) -> str:
    """One row of figures per rank, each within 100 columns, what it reads under it.

    Tensor names come from the files: escaped and cut (:data:`NAME_LIMIT`), so a
    newline or a bidi override in one cannot break or disguise the table, and
    wrapped under the row with the reason a rank falls back.
    """
    from ..._settings import DISABLED
    from .._plan import NAME_LIMIT

    header = ("rank", "storage", "window", "reclaimed B", "KV tokens gained")
    rows = [
        (
            str(r.rank),
            size_text(r.storage_bytes) if r.storage_bytes else "-",
            size_text(r.window_bytes),
            f"{r.reclaimed_bytes:,}",
            f"{r.kv_tokens_gained or 0:,}",
        )
        for r in ranks
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )

    lines = [line(header)]
    for r, row in zip(ranks, rows, strict=True):
        lines.append(line(row))
        if r.tensor:
            detail = f"reads {shown(r.tensor, NAME_LIMIT)}"
            if len(r.sources) > 1:
                detail += f" and {plural(len(r.sources) - 1, 'more storage')}"
        elif r.reason == DISABLED:  # the operator's choice, not a fallback (check's words)
            detail = DISABLED
        else:
            detail = f"falls back: {shown(r.reason or '', 300)}"
        lines.append(wrapped(detail, "      "))
    return "\n".join(lines)


def _output() -> type[BaseModel]:
    from ._outputs import PlanOutput

    return PlanOutput


COMMAND = Command(
    name="plan",
    help="read safetensors headers only and show, per rank, what the plugin would reclaim",
    example="plan model.safetensors.index.json --tp 2",
    exits=Exits(
        "every rank would credit, or the plugin is disabled by config",
        "a rank would fall back, so every rank credits 0 (its reason is under its row)",
    ),
    arguments=_arguments,
    run=_run,
    output=_output,
)
