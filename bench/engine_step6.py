"""Step 6 of the engine bench's decision (`_Run.look_up_fields`: the five tiers, the field policy, the schema
checks, the fields' events), its CPU a decision with one timer around it, and the whole decision's, in the
bench's loop (`bench/engine.py`'s input, hooks, storage and sink; the collector off while timing).

`bench/engine.py --parts` times the step's parts too, ~17 timed calls inside it (~1 us each): this times the
step alone, through `bench/engine_record.py`'s timer and printer. `-r` rounds of `-n` decisions; the least round
is the figure, the median beside it (see bench/README.md, thirteenth pass).
"""

from __future__ import annotations

from typing import Any

from engine_record import main

import preflight.engine as engine

PARTS: list[tuple[Any, str | None, str]] = [
    (None, None, "the decision (run_and_record, no timer inside)"),
    (engine._Run, "look_up_fields", "step 6: the fields"),
]

if __name__ == "__main__":
    main(PARTS, __doc__)
