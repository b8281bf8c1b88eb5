from .tools._cli import main

raise SystemExit(main())
