"""Triton's ``do_bench`` flush pointed at the weights: two instance attributes on one driver.

urllib3's pyopenssl style: the patch and its undo side by side. Each change's undo is
appended to the caller's list *before* the change is made, and an undo puts back what
was there only where the plugin's replacement still stands, so running every undo in
the list, at any time and more than once, is always safe. The undo acts on the driver
instance it patched, whichever driver is active by then (a host may ``set_active`` or
``reset_active`` in between): that instance's class methods show through again.

Passive: nothing here imports the start-up or calls back into it.
"""

from __future__ import annotations

from collections.abc import Callable

from .._errors import InstallError
from .._eviction import WeightEviction
from .flush import Counts, flush_methods
from .proof import METHODS, TritonProof, took

Undo = list[Callable[[], None]]


class TritonSeam:
    """Where one installation's eviction enters Triton's ``do_bench``, and what it asked."""

    def __init__(self, proof: TritonProof, scratch: int) -> None:
        self.proof = proof
        self.scratch = scratch
        """Bytes of the scratch each served ``do_bench`` call makes and zeroes after the read."""
        self.counts = Counts()

    def install(self, eviction: WeightEviction, undo: Undo) -> None:
        """Set both methods on the proven driver instance, each undo landing in ``undo`` before
        its change; then check that ``triton.runtime.driver.active`` resolves to them, else undo
        both and raise :class:`InstallError` with the reason."""
        driver = self.proof.driver
        originals = {method: getattr(driver, method) for method in METHODS}
        replacements = flush_methods(eviction, originals, self.scratch, self.counts)
        mine: Undo = []
        for method in METHODS:
            mine.append(_set_on_instance(driver, method, replacements[method], undo))
        problem = took(self.proof, replacements)
        if problem is not None:
            for step in reversed(mine):
                step()
            raise InstallError(problem)


def _set_on_instance(
    driver: object, name: str, replacement: object, undo: Undo
) -> Callable[[], None]:
    """Shadow the class's method ``name`` with ``replacement`` in ``driver``'s own ``__dict__``;
    returns the undo it registered first."""
    held = vars(driver)  # this instance's own attributes, whichever driver is active later
    if name in held:
        previous = held[name]

        def put_back() -> None:
            # One line: a signal handler that ends this start-up runs before the check or after
            # the write, never between them; the write is one C call.
            held.get(name) is replacement and held.__setitem__(name, previous)  # type: ignore[func-returns-value]

    else:

        def put_back() -> None:
            held.get(name) is replacement and held.pop(name, None)

    undo.append(put_back)
    held[name] = replacement
    return put_back
