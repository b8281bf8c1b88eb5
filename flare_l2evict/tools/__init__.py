"""Tools around the runtime: never imported by the plugin a server loads.

The CLI (``flare-l2evict``, :mod:`.cli`: one module per command), the preflight
check's steps, the offline plan and its safetensors header reader and the reference
host (a test and demo harness, not a server) live here. The GPU bench is not in the
wheel: it is the checkout's ``benchmarks/bench``. The runtime modules beside this package
(``flare_l2evict._*``, :mod:`flare_l2evict.plugin`, :mod:`flare_l2evict.hookspecs`)
import nothing from it; the public ``flare_l2evict.load_deployment_config`` is
:mod:`._config_file`'s, loaded on first use (a server passes its config as a mapping).

Public entry point: :func:`main` (the ``flare-l2evict`` command, callable with
an argument list).
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run ``flare-l2evict`` with ``argv`` (default: ``sys.argv[1:]``); returns its exit code."""
    from .cli import main as cli

    return cli(argv)
