"""The Triton wing: everything in the runtime that names Triton's driver, and nothing else does.

:mod:`.proof` (the Triton here flushes ``do_bench`` through the active CUDA driver's two
methods, looked up at call time), :mod:`.flush` (the plugin's two methods: read the
eviction window, then write a scratch of about one L2), :mod:`.seam` (setting them on
the driver instance, each undo registered before its change) and :mod:`.wing` (what the
start-up takes beside b12x's seam: whether to install, the install that never raises, the
report's and the audit's sections, the one line). The core imports :mod:`.wing` alone.
"""
