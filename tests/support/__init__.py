"""The tests' helpers: figures, stand-in b12x releases, and the code child processes run.

Nothing here is collected as a test. The tests import these as ``support.NAME``
(pytest puts ``tests/`` on ``sys.path``; mypy's ``mypy_path`` does the same).
"""
