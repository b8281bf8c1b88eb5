"""Tools around the runtime: never imported by the plugin a server loads.

The CLI (``flare-l2evict``), the preflight check, the offline plan and its
safetensors header reader, the reference host (a test and demo harness, not a
server) and the GPU bench live here. The runtime modules beside this package
(``flare_l2evict._*``, :mod:`flare_l2evict.plugin`, :mod:`flare_l2evict.hookspecs`)
import nothing from it.

Public entry points: :func:`main` (the ``flare-l2evict`` command, callable with
an argument list) and :mod:`flare_l2evict.tools.bench` (the measurements).
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run ``flare-l2evict`` with ``argv`` (default: ``sys.argv[1:]``); returns its exit code."""
    from ._cli import main as cli

    return cli(argv)
