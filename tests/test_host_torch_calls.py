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
from support.hosts import CREDIT, WEIGHT, complete, hook, runtime, seam
from support.startups import installed

from flare_l2evict.tools._origin import stock_row
from flare_l2evict.tools.reference_host import ReferenceRuntime

pytest.importorskip(stock_row().module_path)


class Expert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(torch.zeros(64 * MiB // 4), requires_grad=False)


@pytest.fixture(autouse=True)
def _finished() -> Iterator[None]:
    yield
    torch.__future__.set_swap_module_params_on_conversion(False)


@dataclasses.dataclass
class ModelRuntimeStandIn(ReferenceRuntime):
    """A host whose resident_tensors() names the model's parameters as they are now."""

    model: Expert | None = None

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        assert self.model is not None
        return {WEIGHT: self.model.w13_weight}


def started(model: Expert) -> ReferenceRuntime:
    host = runtime(tensors={}, kind=ModelRuntimeStandIn, model=model)
    assert hook(host).reclaimed_bytes == CREDIT
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
    flush = seam()(torch.device("cpu"), enabled=True)  # type: ignore[operator]
    flush()  # the next read: the memory it read was moved away
    installation = installed()
    assert installation is not None
    assert installation.audit().fallback_reason is not None
    audit = complete(host)
    assert audit.warns and audit.fallback_reason is not None
    assert installed() is None
