"""``on_error``: how a start-up that falls back is told to the host.

Case -> outcome:

- ``on_error = "raise"`` -> one line raised (a ``FallbackError``, the one class the hook lets
  through) on every outcome that falls back: no storage covers the window, ``exclude``
  matches every tensor, 0 race jobs, ``startup_complete`` during the hook; nothing credited,
  stock b12x bound;
- ``on_error = "raise"`` and a refused repeated call -> raises one line, the first start-up
  stands;
- ``enabled = false`` -> never raises, under ``on_error = "raise"`` too; one INFO line and no
  WARNING (the operator's choice pages no one).

Settings that differ across ranks: ``test_tp_gloo.py``; contract violations under ``raise``:
``test_host_values.py``. The host's runtime is a stand-in (named so); pluggy, the plugin,
b12x's real seam and torch are real.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from support.figures import MiB
from support.hosts import CREDIT, complete, hook, runtime, seam_is_ours
from support.startups import end_any, installed

from flare_l2evict import L2EvictError
from flare_l2evict._errors import FallbackError
from flare_l2evict.tools.reference_host import ReferenceRuntime

pytest.importorskip("b12x.preparation._measurement")
RAISE = {"plugins": {"l2evict": {"on_error": "raise"}}}


class EndingMappingStandIn(dict[str, torch.Tensor]):
    """The host's resident tensors, whose first iteration ends the start-up (as another thread's
    startup_complete would, while the plugin reads the mapping)."""

    def __iter__(self) -> Iterator[str]:
        end_any()  # startup_complete, while the hook runs
        return super().__iter__()


def _ends_itself_during_the_hook() -> ReferenceRuntime:
    class EndingRuntimeStandIn(ReferenceRuntime):
        def resident_tensors(self) -> Any:
            return EndingMappingStandIn(super().resident_tensors())

    base = runtime(config=RAISE)
    return EndingRuntimeStandIn(**{k: getattr(base, k) for k in base.__dataclass_fields__})


FALLBACKS: dict[str, tuple[Callable[[], ReferenceRuntime], str]] = {
    "no-storage-covers-the-window": (
        lambda: runtime(nbytes=MiB, config=RAISE),
        "eligible storage",
    ),
    "exclude-matches-every-tensor": (
        lambda: runtime(config={"plugins": {"l2evict": {"on_error": "raise", "exclude": ["*"]}}}),
        "eligible",
    ),
    "race-jobs-0": (lambda: runtime(config=RAISE, race_jobs=0), "0 race jobs"),
    "startup-complete-during-the-hook": (_ends_itself_during_the_hook, "startup_complete ran"),
}


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_on_error_raise_raises_on_every_fallback(case: str) -> None:
    make, cause = FALLBACKS[case]
    host = make()
    with pytest.raises(L2EvictError, match="on_error = 'raise'") as raised:
        hook(host)
    assert type(raised.value) is FallbackError  # the one class the hook lets through
    assert cause in str(raised.value) and "\n" not in str(raised.value)
    assert host.kv_allocator.reclaimed_bytes == 0
    assert installed() is None and not seam_is_ours()


def test_on_error_raise_raises_on_a_refused_repeated_call_and_keeps_the_first() -> None:
    host = runtime(config=RAISE)
    assert hook(host).reclaimed_bytes == CREDIT
    with pytest.raises(L2EvictError, match=r"on_error = 'raise'.*repeated call") as raised:
        hook(host)
    assert "\n" not in str(raised.value)
    assert host.kv_allocator.reclaimed_bytes == CREDIT and seam_is_ours()  # the first stands


def test_on_error_raise_does_not_raise_when_disabled() -> None:
    host = runtime(config={"plugins": {"l2evict": {"on_error": "raise", "enabled": False}}})
    report = hook(host)
    assert report.reclaimed_bytes == 0 and "enabled = false" in (report.reason or "")


def test_a_start_up_disabled_by_config_logs_one_info_line_and_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 29: enabled = false is the operator's choice; a WARNING at every start-up
    # would page someone for a deliberate setting.
    host = runtime(config={"plugins": {"l2evict": {"enabled": False}}})
    with caplog.at_level(logging.DEBUG, logger="flare_l2evict"):
        report = hook(host)
        complete(host)
    assert report.reclaimed_bytes == 0 and "enabled = false" in (report.reason or "")
    ours = [r for r in caplog.records if r.name == "flare_l2evict"]
    assert [r.levelno for r in ours if "enabled = false" in r.getMessage()] == [logging.INFO]
    assert not [r for r in ours if r.levelno >= logging.WARNING], [r.getMessage() for r in ours]
