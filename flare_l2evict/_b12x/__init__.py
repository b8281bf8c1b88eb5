"""The b12x wing: everything in the runtime that names b12x, and nothing else does.

- :mod:`.table`: the seam as data, one row per b12x shape (its module,
  function, signature, calling convention, callers and buffer bytes);
- :mod:`.proof`: the proof, before anything changes, that the loaded b12x
  matches a row, and stock's measured buffer;
- :mod:`.provider`: which b12x provider and torch run here (no import of b12x);
- :mod:`.patch`: the patch of the races' eviction and its undo, side by side.

A test (``tests/test_house.py``) fails if another runtime module imports b12x
or spells its names.
"""
