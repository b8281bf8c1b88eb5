"""What the plugin requires of the host's KV allocator before it offers it anything."""

from __future__ import annotations

import inspect

from ._errors import RuntimeContractError


def refuse_async(add: object) -> None:
    """An ``async def add_reclaimed`` would never run: refuse it before anything is offered."""
    call = getattr(type(add), "__call__", None)  # noqa: B004  # the class's, for callable objects
    if inspect.iscoroutinefunction(add) or (
        not inspect.isroutine(add) and inspect.iscoroutinefunction(call)
    ):
        raise RuntimeContractError(
            "runtime.kv_allocator.add_reclaimed is a coroutine function (async def): the plugin "
            "calls it synchronously, so its credit would never be applied; fix: make "
            "add_reclaimed a plain function that grows the KV budget before returning"
        )
