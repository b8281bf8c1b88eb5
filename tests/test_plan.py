"""``flare-l2evict plan``: headers only, per rank, agreeing with the start-up choice."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from support.checkpoints import sparse_zeros
from support.figures import KV_BYTES_PER_TOKEN as KV, OWN, MiB
from support.json_output import parsed

from flare_l2evict._text import shown
from flare_l2evict.tools import main
from flare_l2evict.tools._headers import read_checkpoint
from flare_l2evict.tools.reference_host import PROFILES, ReferenceHost, write_sparse_index


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(["plan", *argv, "--json"])
    plan = parsed("plan", capsys.readouterr().out)
    # One meaning per exit code (issue 29): 1 when any rank falls back, so all credit 0.
    assert code == plan["exit_code"] == (1 if plan["agreed_reclaimed_bytes"] == 0 else 0)
    assert plan["schema"] == 3
    return plan


def test_plan_and_startup_choose_the_same_tensor(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A file of zeros as save_file writes it, its data a sparse hole: the start-up loads the
    # same zeros without 320 MiB written to disk first.
    path = sparse_zeros(
        tmp_path / "model.safetensors",
        {
            "model.embed_tokens.weight": (40 * MiB,),  # largest, but excluded
            "model.layers.1.mlp.experts.w13_weight": (20 * MiB,),
            "model.layers.0.mlp.experts.w13_weight": (20 * MiB,),  # tie: sorts first
            "model.norm.weight": (16,),
        },
    )
    config = tmp_path / "deploy.toml"
    config.write_text('[plugins.l2evict]\nexclude = ["*.embed_tokens.*"]\n')
    plan = plan_json(capsys, str(path), "--config", str(config), "--profile", "h100")
    (rank,) = plan["ranks"]
    host = ReferenceHost(
        plugins=["l2evict"],
        config={"plugins": {"l2evict": {"exclude": ["*.embed_tokens.*"]}}},
        profile=PROFILES["h100"],
        kv_bytes_per_token=KV,
    )
    report = host.start(path).report
    assert report is not None
    assert rank["tensor"] == report.source_tensor == "model.layers.0.mlp.experts.w13_weight"
    # Neither 80 MiB block covers the 100 MiB window: both read, in the same order.
    assert rank["sources"] == [s.tensor for s in report.sources]
    assert rank["storage_bytes"] == report.source_storage_bytes == 160 * MiB
    assert rank["reclaimed_bytes"] == report.reclaimed_bytes == 5 * 100 * MiB - OWN
    assert rank["kv_tokens_gained"] == (5 * 100 * MiB - OWN) // KV


def test_per_rank_files_and_the_agreed_minimum(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rank0 = sparse_zeros(tmp_path / "rank0.safetensors", {"w.rank0": (32 * MiB,)})
    rank1 = sparse_zeros(tmp_path / "rank1.safetensors", {"w.rank1": (MiB,)})
    plan = plan_json(capsys, str(rank0), str(rank1), "--tp", "2", "--per-rank", "--l2-mib", "16")
    assert [r["tensor"] for r in plan["ranks"]] == ["w.rank0", None]
    assert plan["ranks"][0]["reclaimed_bytes"] == 5 * 64 * MiB - OWN
    assert "covers the" in plan["ranks"][1]["reason"]
    assert plan["agreed_reclaimed_bytes"] == 0
    assert plan["estimate"] is None


def test_unsharded_split_is_an_estimate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # plan reads headers only: the 872 MiB of data are a sparse hole, not written.
    shapes = {"experts": (4, 32 * MiB), "odd": (3, 30 * MiB)}
    path = sparse_zeros(tmp_path / "model.safetensors", shapes)
    plan = plan_json(capsys, str(path), "--tp", "4", "--l2-mib", "16")
    assert plan["estimate"].startswith("estimate: an unsharded checkpoint split evenly along dim 0")
    # "experts" splits to 128 MiB per rank; "odd" (3 rows) is replicated at 360 MiB.
    assert {r["tensor"] for r in plan["ranks"]} == {"odd"}
    assert {r["storage_bytes"] for r in plan["ranks"]} == {360 * MiB}


def test_index_of_real_files(
    capsys: pytest.CaptureFixture[str], write_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    write_checkpoint({"a": torch.zeros(20 * MiB)}, "model-1.safetensors")
    write_checkpoint({"b": torch.zeros(30 * MiB)}, "model-2.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(
        json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}})
    )
    plan = plan_json(capsys, str(index), "--l2-mib", "16")
    assert plan["tensors"] == 2 and plan["files"] == 2
    assert plan["ranks"][0]["tensor"] == "b"


def test_sparse_index_headers_are_real_safetensors(tmp_path: Path) -> None:
    from safetensors import safe_open

    index = write_sparse_index(tmp_path, files=3, layers=4, experts=2)
    headers = read_checkpoint([index])
    shard = tmp_path / json.loads(index.read_text())["weight_map"]["lm_head.weight"]
    with safe_open(str(shard), framework="pt") as handle:
        shape = handle.get_slice("lm_head.weight").get_shape()
    (lm_head,) = [t for t in headers if t.name == "lm_head.weight"]
    assert list(lm_head.shape) == shape == [129280, 7168]
    assert lm_head.nbytes == 129280 * 7168 * 2


@pytest.mark.parametrize(
    "problem", ["missing_shard", "corrupt_header", "empty_index", "bad_offsets"]
)
def test_header_errors_are_one_line(
    capsys: pytest.CaptureFixture[str],
    write_checkpoint: Callable[..., Path],
    tmp_path: Path,
    problem: str,
) -> None:
    shard = write_checkpoint({"a": torch.zeros(1000)}, "model-1.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {"a": "model-1.safetensors"}
    if problem == "missing_shard":
        weight_map["b"] = "model-2.safetensors"
    elif problem == "corrupt_header":
        shard.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    elif problem == "empty_index":
        weight_map = {}
    elif problem == "bad_offsets":
        data = shard.read_bytes()
        shard.write_bytes(data[:-1000])
    index.write_text(json.dumps({"weight_map": weight_map}))
    assert main(["plan", str(index)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    expected = {
        "missing_shard": "shard 'model-2.safetensors' named in the index is missing",
        "corrupt_header": "corrupt safetensors header (declares 1,000,000,000,000 header bytes",
        "empty_index": "the index names no tensors",
        "bad_offsets": "corrupt safetensors header at 'a'",
    }[problem]
    assert expected in err


def test_per_rank_needs_one_file_per_rank(
    capsys: pytest.CaptureFixture[str], write_checkpoint: Callable[..., Path]
) -> None:
    path = write_checkpoint({"a": torch.zeros(10)})
    assert main(["plan", str(path), "--tp", "2", "--per-rank"]) == 2
    assert "--per-rank needs one checkpoint per rank: got 1 for --tp 2" in capsys.readouterr().err


def test_table_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = sparse_zeros(tmp_path / "model.safetensors", {"w": (32 * MiB,)})
    assert main(["plan", str(path), "--l2-mib", "16"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[3].split() == [
        "rank",
        "storage",
        "window",
        "reclaimed",
        "B",
        "KV",
        "tokens",
        "gained",
    ]
    assert f"agreed across ranks (minimum): {5 * 64 * MiB - OWN:,} bytes" in out


def test_a_shard_given_twice_or_through_an_alias_is_credited_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The report: one 96 MiB shard does not cover a 128 MiB window; read twice it seemed to."""
    shard = sparse_zeros(tmp_path / "shard2.safetensors", {"w": (96 * MiB // 4,)})
    (tmp_path / "link.safetensors").symlink_to(shard)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "shard2.safetensors"}}))
    alias = tmp_path / "alias.safetensors.index.json"
    alias.write_text(json.dumps({"weight_map": {"w": "./shard2.safetensors"}}))
    once = plan_json(capsys, str(shard), "--l2-mib", "64")
    assert once["agreed_reclaimed_bytes"] == 0 and once["files"] == 1
    for spellings in (
        [shard, shard],
        [shard, tmp_path / "." / shard.name],
        [shard, tmp_path / "link.safetensors"],
        [index, alias],
        [index, shard],
    ):
        plan = plan_json(capsys, *map(str, spellings), "--l2-mib", "64")
        assert plan["agreed_reclaimed_bytes"] == 0
        assert (plan["tensors"], plan["files"]) == (1, 1)


def test_a_split_dim_beyond_a_tensors_rank_replicates_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = sparse_zeros(
        tmp_path / "model.safetensors", {"scalar": (), "rows": (4, 8 * MiB), "flat": (MiB,)}
    )
    for dim in ("1", "5", "64"):
        plan = plan_json(capsys, str(path), "--tp", "2", "--split-dim", dim, "--l2-mib", "16")
        # "rows" (128 MiB) splits along dim 1 only; the 0-d and 1-d tensors have no dim 1.
        expected = 64 * MiB if dim == "1" else 128 * MiB
        assert {r["storage_bytes"] for r in plan["ranks"]} == {expected}
        assert plan["estimate"].startswith(
            f"estimate: an unsharded checkpoint split evenly along dim {dim}"
        )


def test_tensor_names_are_escaped_in_the_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    name = "evil\nrank 9  injected\x00\u202eexe.txt" + "x" * 500
    path = sparse_zeros(tmp_path / "model.safetensors", {name: (32 * MiB,)})
    assert main(["plan", str(path), "--l2-mib", "16"]) == 0
    out = capsys.readouterr().out
    assert "evil\\nrank 9  injected\\x00\\u202eexe.txt" in out
    assert (
        "\u202e" not in out and "\x00" not in out and "rank 9  injected" not in out.split("\\n")[0]
    )
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("0 "))
    detail = lines[row + 1]
    assert detail.startswith("      reads evil\\n") and "...[" in detail and len(detail) <= 100
    # JSON cuts the name as the table does, and says so.
    (rank,) = plan_json(capsys, str(path), "--l2-mib", "16")["ranks"]
    assert rank["tensor"] == shown(name, 80) and rank["tensor"] in detail
    assert rank["tensor_chars"] == len(name) and rank["names_cut"] == 2


def test_kv_tokens_are_whole_tokens_of_the_bytes() -> None:
    from flare_l2evict.tools._plan import kv_tokens

    assert kv_tokens(948 * 7 + 947, 948) == 7
    assert kv_tokens(948 * 7, 948) == 7
    assert kv_tokens(-5, 948) == 0
    with pytest.raises(ValueError, match="must be positive"):
        kv_tokens(1, 0)


def test_plan_and_the_startup_table_gain_the_same_kv_tokens(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The issue's case: the example, 1,340,046,848 B at 948 B a token (1,413,551.5 tokens)."""
    assert main(["example", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    path = str(tmp_path / "model.safetensors")
    (rank,) = plan_json(capsys, path)["ranks"]
    assert main(["startup", path, "--plugin", "l2evict", "--json"]) == 0
    started = parsed("startup", capsys.readouterr().out)
    gained = started["with"]["kv_tokens"] - started["without"]["kv_tokens"]
    assert rank["reclaimed_bytes"] == started["with"]["reclaimed_bytes"]
    assert rank["kv_tokens_gained"] == gained == rank["reclaimed_bytes"] // KV
    assert rank["reclaimed_bytes"] % KV  # a case where flooring each figure differs


def test_a_rank_that_falls_back_fits_100_columns_with_its_reason_under_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    long_name = "model.layers.0." + "very_long_module_name." * 10 + "weight"
    rank0 = sparse_zeros(tmp_path / "rank0.safetensors", {long_name: (32 * MiB,)})
    rank1 = sparse_zeros(tmp_path / "rank1.safetensors", {"w.rank1": (MiB,)})
    assert main(["plan", str(rank0), str(rank1), "--tp", "2", "--per-rank", "--l2-mib", "16"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    row = lines.index(next(line for line in lines if line.startswith("1 ")))
    assert lines[row + 1].startswith("      falls back: no storage")
    assert f"...[{len(long_name):,} chars]" in out


def test_plan_json_cuts_a_huge_name_as_the_table_does_and_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    name = "w" * 1_000_000
    path = sparse_zeros(tmp_path / "model.safetensors", {name: (32 * MiB,)})
    assert main(["plan", str(path), "--l2-mib", "16", "--json"]) == 0
    raw = capsys.readouterr().out
    assert len(raw) < 5_000  # not the 2 MB of the name twice
    (rank,) = parsed("plan", raw)["ranks"]
    assert rank["tensor"] == rank["sources"][0] == "w" * 60 + "...[1,000,000 chars]"
    assert rank["tensor_chars"] == 1_000_000 and rank["names_cut"] == 2
    assert main(["plan", str(path), "--l2-mib", "16"]) == 0
    assert f"reads {rank['tensor']}" in capsys.readouterr().out
