"""`python -m dtask.cli`: how `dtask up` starts its child processes."""

from dtask.cli import main

raise SystemExit(main())
