"""``python -m projections``: run the projector (``run``) or rebuild a database from offset 0 (``replay``)."""

from projections.projector import main

raise SystemExit(main())
