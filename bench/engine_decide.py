"""The deciding steps of the engine bench's decision, each timed alone in the bench's loop (`bench/engine.py`'s
input, hooks, storage and sink; the collector off while timing): `Preflight._decide` (input validation and steps
0-9), the run's start (`_Run.__init__`: `started_summary`) and each step, one timer a process run at a time, as
`bench/engine_record.py` times the record's parts. `-r` rounds of `-n` decisions; the least round is the figure,
the median beside it (see bench/README.md, fifteenth pass: the deciding steps).
"""

from __future__ import annotations

from typing import Any

from engine_record import main

import preflight.api as api
import preflight.engine as engine

#: (owner, attribute, label); None: the decision itself, untimed inside.
PARTS: list[tuple[Any, str | None, str]] = [
    (None, None, "the decision (run_and_record, no timer inside)"),
    (api.Preflight, "_decide", "deciding (Preflight._decide)"),
    (engine._Run, "__init__", "  the run's start (started_summary)"),
    (engine._Run, "check_checklist_ids", "  step 0: checklist ids"),
    (engine._Run, "settle_fixed_checklist", "  step 1: fixed checklist"),
    (engine._Run, "build_action_key", "  step 2: action key"),
    (engine._Run, "confirm_tool", "  step 3: tool gate"),
    (engine._Run, "read_required_fields", "  step 5: the call's plan"),
    (engine._Run, "look_up_fields", "  step 6: the fields"),
    (engine._Run, "verify_user_checklist", "  step 8: user checklist"),
    (engine._Run, "tally", "  step 9: tally"),
    (api.Preflight, "_emit", "building the events (not a deciding step: the yardstick)"),
]


if __name__ == "__main__":
    main(PARTS, __doc__)
