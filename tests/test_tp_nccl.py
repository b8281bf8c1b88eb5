"""Tensor parallel on real GPUs over NCCL (marker ``gpu``; needs two CUDA devices).

Checks, per rank: one agreed figure on every rank, a measured saving of at
least that figure, the same race winners with and without the plugin, and the
eviction reading the rank's own device. Prints a per-rank table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.multiprocessing.spawn import start_processes

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    from support.nccl_rank import rank_main

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    directory = tmp_path_factory.mktemp("nccl")
    world_size = 2
    for rank in range(world_size):
        (directory / f"rank{rank}").mkdir()
    start_processes(  # type: ignore[no-untyped-call]
        rank_main, args=(world_size, str(directory)), nprocs=world_size, start_method="spawn"
    )
    got = [json.loads(Path(directory, f"rank{r}.json").read_text()) for r in range(world_size)]
    name = torch.cuda.get_device_name(0)
    print(f"\nTP{world_size} over NCCL on {name}; torch {torch.__version__}")
    print(f"{'rank':>4}  {'reclaimed (agreed)':>18}  {'measured saving':>15}  "
          f"{'winners stock / plugin':>22}  eviction reads on")  # fmt: skip
    for rank, r in enumerate(got):
        stock, plugin = r["stock"], r["plugin"]
        saving = stock["race_peak_bytes"] - plugin["race_peak_bytes"]
        print(f"{rank:>4}  {plugin['report']['reclaimed_bytes']:>18,}  {saving:>15,}  "
              f"{str(stock['race_winners']) + ' / ' + str(plugin['race_winners']):>22}  "
              f"{','.join(plugin['eviction_devices'])}")  # fmt: skip
    return got


def test_every_rank_reports_one_nonzero_figure(ranks: list[dict[str, Any]]) -> None:
    agreed = {r["plugin"]["report"]["reclaimed_bytes"] for r in ranks}
    assert len(agreed) == 1 and 0 not in agreed


def test_each_rank_saved_at_least_what_it_reported(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        saving = r["stock"]["race_peak_bytes"] - r["plugin"]["race_peak_bytes"]
        assert saving >= r["plugin"]["report"]["reclaimed_bytes"]


def test_race_winners_are_unchanged(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["stock"]["race_winners"] == r["plugin"]["race_winners"]


def test_each_rank_reads_its_own_device(ranks: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(ranks):
        assert r["plugin"]["eviction_devices"] == [f"cuda:{rank}"]
