"""Measurements run from a checkout, never installed: the wheel is the plugin and its tools.

Run from the repository's root, so that ``benchmarks`` imports:
``python -m benchmarks.bench --help`` (the GPU bench) and
``python -m benchmarks.<script>`` for the scripts beside it.
"""
