"""The errors an operator can see. Each message is one line: the cause, then the fix."""

from __future__ import annotations

from ._text import described, shown


class L2EvictError(Exception):
    """Base of every error this package raises on purpose.

    ``str(error)`` is one line naming the cause and the fix; the CLI prints it as
    ``error: <message>`` and exits 2, with no traceback.
    """


class ConfigError(L2EvictError):
    """The deployment config or the plugin's section of it is unreadable or invalid."""


class CheckpointError(L2EvictError):
    """A checkpoint path is missing, not safetensors, or truncated."""


class PluginNotFoundError(L2EvictError):
    """``--plugin NAME`` names no installed ``flare.plugins`` entry point."""


class InstallError(L2EvictError):
    """b12x is missing, or its race-eviction seam does not have the expected shape."""


class WeightsError(L2EvictError):
    """No resident storage on the device can serve as the eviction source."""


class RuntimeContractError(L2EvictError):
    """The host's ``runtime`` lacks an attribute of the contract, or holds one out of range."""


class FallbackError(L2EvictError):
    """A fallback that ``on_error = "raise"`` turns into an exception: raised by
    ``_core.faulted`` alone, the one exception a start-up lets through to its caller."""


def reason_of(error: BaseException) -> str:
    """One line: our own errors as they are, anything else with its type; never raises."""
    if issubclass(type(error), L2EvictError):
        return shown(" ".join(str(error).split()), 500)
    return described(error, 500)
