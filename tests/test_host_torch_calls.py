"""The plugin's checks never change what the host's own torch calls do (issue 28).

Between ``before_first_capture`` and ``startup_complete`` a host may swap,
convert, reload or re-point its weights. Each call behaves exactly as
without the plugin (the eviction keeps no weak reference on a host tensor:
``torch.utils.swap_tensors`` refuses one that has any); where the call moves
the memory the races read, the next read falls back, as for a freed storage,
and the audit names the shortfall. Real pluggy, real b12x seam, real torch;
the host's runtime and allocator are the reference host's.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator

import pytest
import torch
from support.figures import MiB
from support.startups import end_any, installed

from flare_l2evict.tools._origin import stock_row
from flare_l2evict.tools.reference_host import (
    ReferenceKVAllocator,
    ReferenceRuntime,
    plugin_manager,
)

measurement = pytest.importorskip(stock_row().module_path)
PM = plugin_manager(["l2evict"])
NAME = "model.layers.0.mlp.experts.w13_weight"


class Expert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(torch.zeros(64 * MiB // 4), requires_grad=False)


@pytest.fixture(autouse=True)
def _finished() -> Iterator[None]:
    yield
    torch.__future__.set_swap_module_params_on_conversion(False)
    end_any()


@dataclasses.dataclass
class ModelRuntimeStandIn(ReferenceRuntime):
    """A host whose resident_tensors() names the model's parameters as they are now."""

    model: Expert | None = None

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        assert self.model is not None
        return {NAME: self.model.w13_weight}


def started(model: Expert) -> ReferenceRuntime:
    host = ModelRuntimeStandIn(
        device=torch.device("cpu"),
        config={},
        kv_allocator=ReferenceKVAllocator(1024),
        race_jobs=1,
        l2_cache_bytes=8 * MiB,
        tensors={},
        model=model,
    )
    (report,) = PM.hook.before_first_capture(runtime=host)
    assert report.reclaimed_bytes > 0
    return host


def swap(model: Expert) -> None:
    torch.utils.swap_tensors(model.w13_weight, torch.nn.Parameter(torch.ones(16)))  # type: ignore[no-untyped-call]


def half_with_swap(model: Expert) -> None:
    torch.__future__.set_swap_module_params_on_conversion(True)
    model.half()


def load_assign(model: Expert) -> None:
    model.load_state_dict({"w13_weight": torch.ones(64 * MiB // 4)}, assign=True)


def set_(model: Expert) -> None:
    with torch.no_grad():
        model.w13_weight.set_(torch.ones(64 * MiB // 4))  # type: ignore[call-overload]


CALLS: dict[str, Callable[[Expert], None]] = {
    "swap_tensors": swap,
    "half-with-swap-on-conversion": half_with_swap,
    "load_state_dict-assign": load_assign,
    "set_": set_,
}


@pytest.mark.parametrize("call", list(CALLS.values()), ids=list(CALLS))
def test_a_host_torch_call_works_as_without_the_plugin_and_the_next_read_falls_back(
    call: Callable[[Expert], None],
) -> None:
    model = Expert()
    host = started(model)
    assert not weakref.getweakrefs(model.w13_weight)  # what swap_tensors refuses
    call(model)  # raises nothing, as without the plugin
    flush = getattr(measurement, stock_row().function)(torch.device("cpu"), enabled=True)
    flush()  # the next read: the memory it read was moved away
    installation = installed()
    assert installation is not None
    assert installation.audit().fallback_reason is not None
    (audit,) = PM.hook.startup_complete(runtime=host)
    assert audit.warns and audit.fallback_reason is not None
    assert installed() is None
