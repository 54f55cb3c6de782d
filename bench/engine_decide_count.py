"""`Preflight._decide` run `k` times on the engine bench's input, after the bench's warm-up, for counting its
instructions (bench/README.md, seventeenth pass: the deciding steps): the difference of two process runs, `k` =
2100 and `k` = 100, over 2000 is the count a decision, the start and the warm-up cancelling out::

    PYTHONHASHSEED=0 setarch -R valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        .venv/bin/python bench/engine_decide_count.py 2100

(and again with 100; valgrind prints "I refs"). Run-to-run spread here: ~2-3k instructions a decision.
"""

from __future__ import annotations

import asyncio
import gc
import sys

from engine import HOOKS, INPUT, LogSink

from preflight import MemoryStorage, create_preflight


async def main(k: int) -> None:
    pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=LogSink(), strict=True)
    for _ in range(300):
        await pf.run_and_record(INPUT)
    gc.disable()
    for _ in range(k):
        await pf._decide(INPUT)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
