"""The reference host refuses, in one line, a CPU load this machine cannot hold (issue 35, item 6).

``startup --l2-mib 4096`` was accepted, then needed about 20 GB of RAM: the
CPU load copies every tensor out of its mapped file. Each refusal here is
made from file sizes alone: nothing of the checkpoint is allocated.
"""

from __future__ import annotations

import os
import re
import resource
from pathlib import Path

import pytest
from support.stderr import the_error

from flare_l2evict._errors import CheckpointError
from flare_l2evict.tools import _machine_memory, main
from flare_l2evict.tools._machine_memory import (
    FALLBACK_BYTES,
    available_memory,
    cpu_load_bytes,
    refuse_what_this_machine_cannot_hold,
)
from flare_l2evict.tools._profiles import GiB
from flare_l2evict.tools.reference_host import PROFILES, ReferenceHost
from flare_l2evict.tools.reference_host._example import write_headers

_LINE = re.compile(r"^error: flare-l2evict startup: (.+); fix: (.+)\n$")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux counts KiB


def _meminfo(tmp_path: Path, available_kib: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(
        f"MemTotal:       {4 * available_kib} kB\nMemFree:        1024 kB\n"
        f"MemAvailable:   {available_kib} kB\nBuffers:        0 kB\n"
    )
    return path


def test_a_checkpoint_larger_than_any_machine_is_refused_in_one_line_without_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 TiB of float32 zeros, declared by a valid header over a sparse file: no disk, no RAM.
    huge = write_headers(tmp_path / "huge.safetensors", [("w", "F32", (1 << 40,))])
    before = _peak_rss_bytes()
    code = main(["startup", str(huge), "--plugin", "l2evict"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    line = _LINE.match(the_error(err))
    assert line is not None, err
    assert "needs about 8,192.0 GiB" in line.group(1) and "GiB available (" in line.group(1)
    assert "free memory, pass a smaller checkpoint" in line.group(2)
    assert _peak_rss_bytes() - before < 1 * GiB  # refused before a byte of it was copied


def test_the_embedded_example_at_the_largest_l2_is_refused_where_memory_is_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's command: 8 GiB available cannot hold a 9.0 GiB file copied out of its map."""
    monkeypatch.setattr(_machine_memory, "MEMINFO", _meminfo(tmp_path, 8 * 1024 * 1024))
    code = main(["startup", "--plugin", "l2evict", "--l2-mib", "4096"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    line = _LINE.match(the_error(err))
    assert line is not None, err
    assert "needs about 18.1 GiB" in line.group(1)
    assert f"8.0 GiB available (MemAvailable in {tmp_path / 'meminfo'})" in line.group(1)
    assert "a smaller --l2-mib" in line.group(2)


def test_the_host_refuses_one_file_too_on_the_cpu(tmp_path: Path) -> None:
    path = write_headers(tmp_path / "model.safetensors", [("w", "F32", (1 << 30,))])  # 4 GiB
    meminfo = _meminfo(tmp_path, 1024 * 1024)  # 1 GiB
    with pytest.raises(CheckpointError, match=r"needs about 8\.0 GiB \(8,589,934,[0-9]+ bytes"):
        refuse_what_this_machine_cannot_hold([path], meminfo)
    host = ReferenceHost(profile=PROFILES["h100"], kv_bytes_per_token=948)
    before = _peak_rss_bytes()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_machine_memory, "MEMINFO", meminfo)
        with pytest.raises(
            CheckpointError, match=r"loading the checkpoint on the CPU .*1 file, each"
        ):
            host.start(path)
    assert _peak_rss_bytes() - before < 1 * GiB


def test_what_fits_is_loaded(tmp_path: Path) -> None:
    path = write_headers(tmp_path / "model.safetensors", [("w", "F32", (1024,))])
    refuse_what_this_machine_cannot_hold([path], _meminfo(tmp_path, 1024))  # 1 MiB: it fits


def test_a_load_holds_every_file_copied_plus_the_largest_mapped(tmp_path: Path) -> None:
    small = write_headers(tmp_path / "a.safetensors", [("a", "F32", (1000,))])
    large = write_headers(tmp_path / "b.safetensors", [("b", "F32", (5000,))])
    sizes = small.stat().st_size, large.stat().st_size
    assert cpu_load_bytes([small, large, large]) == sum(sizes) + max(sizes)
    assert cpu_load_bytes([tmp_path / "missing.safetensors"]) == 0  # the loader says why


def test_available_memory_reads_memavailable_then_sysconf_then_a_fixed_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert available_memory(_meminfo(tmp_path, 3 * 1024 * 1024)) == (
        3 * GiB,
        f"MemAvailable in {tmp_path / 'meminfo'}",
    )
    if Path("/proc/meminfo").is_file():
        figure, source = available_memory()
        assert figure > 0 and source == "MemAvailable in /proc/meminfo"
    # A file without the line (or a hostile one, cut at 64 KiB) is not believed.
    odd = tmp_path / "odd"
    odd.write_bytes(b"MemFree: 1 kB\n" + b"x" * (1 << 20) + b"\nMemAvailable: 1 kB\n")
    figure, source = available_memory(odd)
    assert source == "os.sysconf's available pages" and figure > 1024 * 1024

    def unknown(name: str) -> int:
        raise ValueError(f"unrecognized configuration name: {name}")

    monkeypatch.setattr(os, "sysconf", unknown)
    assert available_memory(tmp_path / "absent") == (
        FALLBACK_BYTES,
        "nothing here says, so a fixed 16 GiB",
    )
