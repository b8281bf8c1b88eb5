"""``python -m benchmarks.bench``, from the repository's root."""

from ._command import main

raise SystemExit(main())
