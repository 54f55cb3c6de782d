"""``python -m ledger``: see `ledger.cli`."""

from ledger.cli import main

raise SystemExit(main())
