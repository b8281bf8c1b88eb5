"""The credit's figure: never more than stock would have allocated, 0 unless the window is
read, and on CUDA never more than the memory free when the hook runs.

That the hook never raises and never over-credits whatever the host passes is
``test_host_values.py``'s property test.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from support.figures import MiB
from support.hosts import hook

from flare_l2evict._credit import credit

pytest.importorskip("b12x.preparation._measurement")

sizes = st.integers(min_value=-(1 << 40), max_value=1 << 40)


@given(
    installable=st.booleans(),
    race_jobs=st.integers(min_value=-5, max_value=2048),
    stock=sizes,
    window=sizes,
    read=sizes,
    free=st.one_of(st.none(), sizes),
)
def test_credit_is_bounded_and_zero_unless_the_window_is_read(
    installable: bool, race_jobs: int, stock: int, window: int, read: int, free: int | None
) -> None:
    got = credit(
        installable=installable,
        race_jobs=race_jobs,
        stock_buffer_bytes=stock,
        window_bytes=window,
        read_bytes=read,
        free_bytes=free,
    )
    assert 0 <= got.nbytes <= max(0, race_jobs) * max(0, stock)
    if not installable or read < window or window <= 0:
        assert got.nbytes == 0
    assert (got.nbytes == 0) == (got.reason is not None)
    uncut = credit(
        installable=installable,
        race_jobs=race_jobs,
        stock_buffer_bytes=stock,
        window_bytes=window,
        read_bytes=read,
    )
    assert uncut.uncut_bytes is None  # no free figure (off CUDA): never cut
    if free is None or uncut.nbytes <= max(0, free):  # within what is free: as without it
        assert got == uncut
    else:  # past it: cut to it, and the credit it was cut from is kept
        assert got.nbytes == max(0, free) < uncut.nbytes == got.uncut_bytes


def test_a_credit_past_the_free_memory_is_cut_to_it_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 41: on CUDA, the memory free to torch is read once with the basis; a CPU has no
    # such figure, so the device's reading stands in here for one of 100 MiB free.
    import logging

    from support.hosts import CREDIT, complete, runtime

    from flare_l2evict._b12x import proof

    free = 100 * MiB
    monkeypatch.setattr(proof, "device_free_bytes", lambda device: free)
    host = runtime()
    with caplog.at_level(logging.INFO, logger="flare_l2evict"):
        report = hook(host)
    assert report.reclaimed_bytes == free == host.kv_allocator.reclaimed_bytes
    assert report.device_free_bytes == free and report.uncut_credit_bytes == CREDIT
    (line,) = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert line.levelno == logging.WARNING and "CUT from" in line.getMessage()
    audit = complete(host)
    assert audit.credited_bytes == free and audit.uncut_credit_bytes == CREDIT
    assert audit.device_free_bytes == free and "CUT from" in audit.summary()


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        ((float("nan"), 80 << 30), "[NaN, 85899345920]"),
        ((float("inf"), 80 << 30), "[Infinity, 85899345920]"),
        ((1 << 30, 80 << 30, 7), "[1073741824, 85899345920, 7]"),
    ],
    ids=["nan", "inf", "three-values"],
)
def test_a_free_memory_figure_that_is_no_figure_is_one_line_naming_its_source(
    monkeypatch: pytest.MonkeyPatch, returned: tuple[float, ...], shown: str
) -> None:
    # Issue 46: NaN, inf or three values fell back with a bare ValueError (or OverflowError)
    # naming neither the figure nor torch.cuda.mem_get_info. A CPU reads no such figure: the
    # CUDA calls are stand-ins here, and the device is named, never used.
    import torch

    from flare_l2evict._b12x import proof
    from flare_l2evict._errors import InstallError

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: returned)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)
    with pytest.raises(InstallError) as raised:
        proof.device_free_bytes(torch.device("cuda", 0))
    line = str(raised.value)
    assert line.startswith(f"torch.cuda.mem_get_info(cuda:0) returned {shown}, not the ")
    assert "\n" not in line and "stock b12x kept. fix: " in line


def test_a_free_memory_figure_of_two_whole_numbers_is_read_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from flare_l2evict._b12x import proof

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 * MiB, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 2 * MiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: MiB)
    assert proof.device_free_bytes(torch.device("cuda", 0)) == 4 * MiB
