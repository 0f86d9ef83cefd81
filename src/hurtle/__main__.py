"""``python -m hurtle`` is the ``hurtle`` command."""

from .cli import main

raise SystemExit(main())
