"""Log lines that cannot break start-up: a host's logging handler may raise (torch-free)."""

from __future__ import annotations

import logging


def say(logger: logging.Logger, level: int, message: str, *args: object) -> None:
    """``logger.log(level, message, *args)``; a handler that raises costs the line, not the hook.

    A log sink that is down must not turn a credit into an exception after the offer.
    """
    try:
        logger.log(level, message, *args)
    except Exception:  # the host's handler; nothing better to do than lose the line
        pass
