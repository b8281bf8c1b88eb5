"""The Triton wing: everything in the runtime that names Triton's driver, and nothing else does.

:mod:`.proof` (the Triton here flushes ``do_bench`` through the active CUDA driver's two
methods, looked up at call time), :mod:`.flush` (the plugin's two methods: read the
eviction window, then write a scratch of about one L2) and :mod:`.seam` (setting them on
the driver instance, each undo registered before its change). Not yet wired into the
start-up: nothing outside this package imports it.
"""
