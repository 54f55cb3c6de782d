"""The compiled canonical form on the engine bench's events (see bench/README.md, fifteenth pass): thread CPU for
one run's events written by `native/`'s `jcs`, by orjson's sorted dump (the yardstick: it sorts keys by code point,
so it is not RFC 8785's writer), sealed by `jcs_sealed` as the engine seals them, and walked by `plain_json`.

The events are the very dicts the engine hands to `jcs_sealed` in one decision of `bench/engine.py`'s scenario (its
members in the engine's order, not sorted), captured on the way. `-r` rounds of `-n` runs' events; the least round is
the figure, the median beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
from engine import HOOKS, INPUT, LogSink

from preflight import MemoryStorage, chain, create_preflight


def captured_fields() -> list[tuple[dict[str, Any], str]]:
    """Each event's fields and link as the engine hands them to `jcs_sealed` in one decision."""
    sealer = chain._native_jcs_sealed
    assert sealer is not None, "native/ is not built (make native)"
    seen: list[tuple[dict[str, Any], str]] = []

    def recording(fields: dict[str, Any], prev: str) -> tuple[str, bytes] | None:
        seen.append((dict(fields), prev))
        return sealer(fields, prev)

    async def one() -> None:
        pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=LogSink(), strict=True)
        await pf.run_and_record(INPUT)

    chain._native_jcs_sealed = recording
    try:
        asyncio.run(one())
    finally:
        chain._native_jcs_sealed = sealer
    return seen


def rounds(fn: Callable[[], object], n: int, r: int) -> list[float]:
    """Seconds of this thread's CPU a call of `fn`, each of `r` rounds of `n` calls, sorted."""
    figures = []
    for _ in range(r):
        start = time.thread_time()
        for _ in range(n):
            fn()
        figures.append((time.thread_time() - start) / n)
    return sorted(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=10_000, help="runs' events a round")
    parser.add_argument("-r", type=int, default=9, help="rounds a writer")
    args = parser.parse_args()
    from preflight_audit_native import jcs, jcs_sealed, plain_json

    sealed = captured_fields()
    bodies = [{k: v for k, v in fields.items() if k != "hash"} for fields, _ in sealed]
    for fields, prev in sealed:
        assert jcs_sealed(fields, prev) is not None

    def written() -> None:
        for body in bodies:
            jcs(body)

    def dumped() -> None:
        for body in bodies:
            orjson.dumps(body, option=orjson.OPT_SORT_KEYS)

    def sealed_all() -> None:
        for fields, prev in sealed:
            jcs_sealed(fields, prev)

    def walked() -> None:
        for body in bodies:
            plain_json(body)

    sizes = [len(jcs(body) or b"") for body in bodies]
    print(f"{len(bodies)} events of {min(sizes)}-{max(sizes)} bytes; us of CPU a run's events, least / median:")
    for label, fn in [
        ("native/ jcs", written),
        ("orjson.dumps(OPT_SORT_KEYS), the yardstick", dumped),
        ("native/ jcs_sealed, as the engine seals", sealed_all),
        ("native/ plain_json", walked),
    ]:
        figures = rounds(fn, args.n, args.r)
        least, median = figures[0] * 1e6, statistics.median(figures) * 1e6
        print(f"{least:6.2f} / {median:6.2f}  {label} ({least / len(bodies):.2f} us an event)")


if __name__ == "__main__":
    main()
