"""Tools around the runtime: never imported by the plugin a server loads.

The CLI (``flare-l2evict``), the preflight check, the offline plan and its
safetensors header reader, the reference host (a test and demo harness, not a
server) and the GPU bench live here. The runtime modules beside this package
(``flare_l2evict._*``, :mod:`flare_l2evict.plugin`, :mod:`flare_l2evict.hookspec`)
import nothing from it.
"""
