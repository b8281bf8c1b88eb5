"""The seam as data: one row per b12x shape the plugin knows how to take the race eviction from.

Everything that names the seam reads it from :data:`ROWS`: supporting a b12x
whose seam moved (or changed its signature) is adding one row. Import-free.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

ROOTS = ("b12x", "flashinfer.experimental.b12x")
"""Where a loaded b12x lives: standalone, or inside flashinfer-python (which aliases the first)."""


@dataclass(frozen=True)
class SeamRow:
    """One b12x shape: where its eviction is made, how it is called, who calls it.

    ``kind`` ``"fork"``: a function handed the storage (``None`` undoes); ``"stock"``: the
    factory the races call, which the plugin replaces. ``callers`` must look the function up
    at call time (those in ``optional`` may be absent). ``device`` and ``enabled`` name the
    parameters :meth:`call` passes (``enabled`` false: no eviction is made).
    """

    name: str
    kind: Literal["fork", "stock"]
    module: str
    function: str
    signature: tuple[tuple[str, str], ...]
    callers: tuple[tuple[str, str], ...] = ()
    optional: tuple[str, ...] = ()
    device: str = "device"
    enabled: str = "enabled"

    def call(self, function: Callable[..., Any], device: object, enabled: bool) -> Any:
        """``function`` called as this row's signature takes a device and the enabled flag."""
        given = {self.device: device, self.enabled: enabled}
        args = [given[n] for n, kind in self.signature if kind == "POSITIONAL_ONLY" and n in given]
        kwargs = {
            n: given[n] for n, kind in self.signature if kind != "POSITIONAL_ONLY" and n in given
        }
        return function(*args, **kwargs)

    @property
    def module_path(self) -> str:
        """The module under the standalone root, e.g. ``b12x.preparation._measurement``."""
        return f"{ROOTS[0]}.{self.module}"

    @property
    def dotted(self) -> str:
        """The full name, for messages: ``b12x.preparation._measurement._l2_flush_fn``."""
        return f"{self.module_path}.{self.function}"

    def root_of(self, module_name: str) -> str | None:
        """The b12x root of a loaded module of this row's seam, or ``None`` if it is not one."""
        suffix = "." + self.module
        return module_name[: -len(suffix)] if module_name.endswith(suffix) else None

    def loaded(self) -> Callable[..., Any] | None:
        """This row's function in the b12x that imports, or ``None`` where it has none."""
        try:
            module = importlib.import_module(self.module_path)
        except Exception:  # a build without the module, or a broken install
            return None
        function = getattr(module, self.function, None)
        return function if callable(function) else None


FORK = SeamRow(
    name="flashinfer fork (voipmonitor/flashinfer PR #6)",
    kind="fork",
    module="comm.pcie",
    function="use_startup_eviction",
    signature=(("storage", "POSITIONAL_OR_KEYWORD"),),
)
"""The fork's API: it takes the resident storage whose reads replace the buffer."""

STOCK_1_5 = SeamRow(
    name="stock b12x 1.5 (flashinfer-python >= 0.7.2)",
    kind="stock",
    module="preparation._measurement",
    function="_l2_flush_fn",
    signature=(("device", "POSITIONAL_OR_KEYWORD"), ("enabled", "KEYWORD_ONLY")),
    callers=(
        ("preparation._measurement", "prepare_race_steps"),
        ("preparation.session", "PreparationJob._measure"),
    ),
    optional=("preparation.session",),  # a b12x without sessions makes no job evictions
)
"""Stock b12x: ``_l2_flush_fn(device, *, enabled)`` makes each race job's buffer."""

ROWS: tuple[SeamRow, ...] = (FORK, STOCK_1_5)
"""Every shape known, the fork first: where its API is present it is used."""


def rows(kind: Literal["fork", "stock"]) -> tuple[SeamRow, ...]:
    return tuple(row for row in ROWS if row.kind == kind)
