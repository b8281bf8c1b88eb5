"""The b12x wing: everything in the runtime that names b12x, and nothing else does.

:mod:`.table` (the seam as data), :mod:`.proof` (the loaded b12x matches a row;
stock's measured buffer: the credit's basis), :mod:`.provider` (which b12x and
torch are here) and :mod:`.seam` (the fork's API or stock's replaced function, each
change with its undo). ``tests/test_house.py`` fails if another runtime module
imports b12x or spells its names.
"""
