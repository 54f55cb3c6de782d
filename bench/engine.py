"""Engine throughput: decisions per second for the seed's bank-transfer scenario (see bench/README.md).

Three required fields (one from pre-set data, one from the instruction with a span, one from a user
answer), one checklist item verified, trivial synchronous hooks, MemoryStorage and a sink that keeps each
event's published bytes, as a broker does (`LogSink`). Every decision is recorded (its events built,
hash-chained, sealed and "published" to memory). Printed beside
two figures measured in the same run:

- the floor an auditing engine cannot go below: validating the input once, then building the run's
  events from plain dicts (no engine logic), writing each in canonical form and hashing the chain --
  each of the three timed apart, and the canonical form timed both ways (RFC 8785 as events of the
  current version are hashed, and the sorted `json.dumps` of versions 1 and 2);
- the public reference skeleton (JavaScript, run with node) deciding the same scenario, when its file is
  in bench/.cache (`make reference-skeleton`); otherwise the column says it is skipped.

Each side's rate is printed by the clock and by its process's CPU time (other load on a shared machine
disturbs the second less). Then the engine again with the collector's youngest generation at a higher
threshold (`--gc-threshold`, a choice for the host process, which the engine as a library does not make).

`--parts` then times the engine's own parts (its steps wrapped with a timer, after the figures above),
with the garbage collector on and off: where a decision's CPU time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import hashlib
import inspect
import json
import shutil
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from preflight import MemoryStorage, PreflightEvent, PreflightInput, chain, create_preflight
from preflight import scenario as sc
from preflight.api import new_id, utc_now
from preflight.chain import GENESIS_HASH, jcs
from preflight.events import HASH_PLACEHOLDER, published_texts

#: The seed's transfer (`preflight.scenario`), its recipient answered: every run decides `execute`.
INPUT: dict[str, Any] = sc.transfer(user_answers=sc.READY_ANSWERS)
HOOKS = sc.hooks()
HERE = Path(__file__).resolve().parent
#: Where `make reference-skeleton` puts the skeleton's file (git-ignored); `--skeleton` names another.
SKELETON = HERE / ".cache" / "execution-state-preflight.js"


class LogSink:
    """The event log as a broker holds it: each event's published bytes (`published_texts`), in order. Not the
    event objects, as the tests' `MemoryEventSink` keeps them: a process publishing to Kafka keeps none,
    and a heap that grows by every run's 9 event models makes each full collection walk all of them."""

    def __init__(self) -> None:
        self.published: list[bytes] = []
        self.runs = 0

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        self.published.extend(published_texts(events))
        self.runs += 1


async def decisions_per_second(n: int) -> tuple[float, float, list[dict[str, Any]]]:
    """Our rate by the clock and by the process's CPU time, and one run's events as plain dicts (the floor's
    templates)."""
    sink = LogSink()
    pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=sink, strict=True)
    first = await pf.run_and_record(INPUT)
    assert first.execution_decision == "execute", first.reason
    for _ in range(min(n, 200)):  # warm up
        await pf.run_and_record(INPUT)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await pf.run_and_record(INPUT)
    elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu
    events = len(first.run_events)
    assert len(sink.published) == sink.runs * events  # every event built, chained, sealed and written
    templates = [json.loads(text) for text in (e._canonical or b"" for e in first.run_events)]
    return n / elapsed, n / cpu_elapsed, templates


def validation_seconds(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        PreflightInput.model_validate(INPUT)
    return (time.perf_counter() - start) / n


def built(templates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run's events as an engine must build them at the least: fresh ids, times and sequence numbers."""
    out = []
    for seq, template in enumerate(templates):
        body = dict(template)
        del body["hash"]
        body["event_id"] = new_id()
        body["occurred_at"] = utc_now()
        body["seq"] = seq
        out.append(body)
    return out


def legacy_canonical(body: dict[str, Any]) -> bytes:
    """Versions 1-2's form as the engine wrote it before (the standard library's sorted json.dumps)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def floor_seconds(templates: list[dict[str, Any]], n: int) -> dict[str, float]:
    """Seconds per decision of each floor stage, timed apart over `n` runs."""
    runs = [built(templates) for _ in range(n)]
    start = time.perf_counter()
    for _ in range(n):
        built(templates)
    build = (time.perf_counter() - start) / n
    start = time.perf_counter()
    texts = [[jcs(body) for body in run] for run in runs]
    canonical = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for run in runs:
        for body in run:
            legacy_canonical(body)
    legacy = (time.perf_counter() - start) / n
    native, chain._native_jcs = chain._native_jcs, None
    try:
        start = time.perf_counter()
        for run in runs:
            for body in run:
                jcs(body)
        python_jcs = (time.perf_counter() - start) / n
    finally:
        chain._native_jcs = native
    start = time.perf_counter()
    for run_texts in texts:
        prev = GENESIS_HASH
        for text in run_texts:
            h = hashlib.sha256(prev.encode())
            h.update(b"\n")
            h.update(text)
            prev = h.hexdigest()
    hashing = (time.perf_counter() - start) / n
    sealed = float("nan")
    if chain._native_jcs_sealed is not None:  # canonical form and hash in one compiled pass, as the engine seals
        one_pass = chain._native_jcs_sealed
        for run in runs:
            for body in run:
                body["hash"] = HASH_PLACEHOLDER
        start = time.perf_counter()
        for run in runs:
            prev = GENESIS_HASH
            for body in run:
                answer = one_pass(body, prev)
                assert answer is not None
                prev = answer[0]
        sealed = (time.perf_counter() - start) / n
    return {
        "build": build,
        "canonical": canonical,
        "legacy": legacy,
        "python_jcs": python_jcs,
        "hash": hashing,
        "sealed": sealed,
    }


def skeleton_rate(n: int, skeleton: Path) -> tuple[float, float] | str:
    """The skeleton's decisions/s by the clock and by its CPU time, or why it was not run."""
    if not skeleton.is_file():
        return f"skipped: no {skeleton} (make reference-skeleton)"
    node = shutil.which("node")
    if node is None:
        return "skipped: no node on PATH"
    out = subprocess.run(
        [node, str(HERE / "skeleton.js"), str(skeleton), str(n)], capture_output=True, text=True, check=True
    )
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["decision"] == "execute", answer
    return float(answer["decisions_per_s"]), float(answer["cpu_decisions_per_s"])


def _parts() -> list[tuple[Any, str, str]]:
    """The parts `--parts` times: (owner, attribute, label); a label's indentation says what it lies in."""
    import preflight.api as api
    import preflight.arguments as arguments
    import preflight.emit as emit
    import preflight.engine as engine
    import preflight.events as events
    import preflight.lookup as lookup
    import preflight.records as records

    run = engine._Run
    return [
        (api.Preflight, "_decide", "deciding (Preflight._decide)"),
        (PreflightInput, "model_validate", "  input validation (PreflightInput)"),
        (run, "__init__", "  the run's start (started_summary: tool digest, intent fingerprint)"),
        (run, "check_checklist_ids", "  step 0: checklist ids"),
        (run, "settle_fixed_checklist", "  step 1: fixed checklist"),
        (run, "confirm_tool", "  step 3: tool gate"),
        (run, "read_required_fields", "  step 5: the call's plan"),
        (run, "look_up_fields", "  step 6: the fields"),
        (lookup, "lookup_field", "    the five tiers"),
        (lookup, "_apply_policy", "    the field policy's answer read (its hook called by settle_field)"),
        (run, "check_the_call", "    the whole call against its JSON Schema"),
        (run, "verify_user_checklist", "  step 8: user checklist"),
        (run, "tally", "  step 9: tally (gate, record model, reason)"),
        (arguments.CallPlan, "leaf_violation", "    the schema check of each leaf (jsonschema-rs, jsonschema)"),
        (arguments.CallPlan, "violations_of", "    the schema check of the whole call (jsonschema-rs, jsonschema)"),
        (api, "new_ids", "the run's ids (its own, its events' and decision's), drawn at its start"),
        (api.Preflight, "_emit", "building the events (Preflight._emit)"),
        *(
            [(chain, "_native_jcs_sealed", "  sealing the 9 events: canonical form and hash (native/ jcs_sealed)")]
            if chain._native_jcs_sealed is not None
            else []
        ),
        (emit, "sealed_text", "  sealing in Python, where the compiled pass does not (or is not built)"),
        (events, "event_canonical_json", "    the canonical form (RFC 8785), where sealed in Python"),
        (emit, "sealed_later", "  what a run keeps of an event, where the chain has no verdict for its shape"),
        (api.Preflight, "record", "recording (Preflight.record)"),
        (api, "_record_digest", "  the record's digest (as_json + canonical form)"),
        (records.KeptEvents, "events", "the event models, built when someone asks for them"),
        (api, "utc_now", "the clock, wherever read"),
    ]


GC_LABEL = "garbage collection, wherever it lands"
#: The parts' clock: this thread's CPU time.
_cpu = time.thread_time


def _timed(fn: Callable[..., Any], label: str, spent: dict[str, float]) -> Callable[..., Any]:
    if asyncio.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            start = _cpu()
            try:
                return await fn(*args, **kwargs)
            finally:
                spent[label] += _cpu() - start

        return timed_async

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = _cpu()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += _cpu() - start

    return timed


async def parts(n: int, collect: bool) -> tuple[float, dict[str, float]]:
    """Seconds of CPU time per decision in all and in each part (its steps wrapped in timers, which add
    ~1 us a call), the garbage collector on (`collect`) or off while timing. CPU time of this thread, not
    the clock: other load on a shared machine then lands in no part."""
    spent: dict[str, float] = defaultdict(float)
    began = [0.0]

    def on_collect(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = _cpu()
        else:
            spent[GC_LABEL] += _cpu() - began[0]
            spent[f"{GC_LABEL} (generation 2)"] += _cpu() - began[0] if info["generation"] == 2 else 0.0

    patched = []
    for owner, name, label in _parts():
        original = inspect.getattr_static(owner, name)
        if isinstance(original, classmethod):
            setattr(owner, name, classmethod(_timed(original.__func__, label, spent)))
        else:
            setattr(owner, name, _timed(original, label, spent))
        patched.append((owner, name, original if name in vars(owner) else None))
    try:
        pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=LogSink(), strict=True)
        for _ in range(min(n, 200)):
            await pf.run_and_record(INPUT)
        spent.clear()
        if not collect:
            gc.disable()
        gc.callbacks.append(on_collect)
        start = _cpu()
        for _ in range(n):
            await pf.run_and_record(INPUT)
        elapsed = _cpu() - start
    finally:
        gc.enable()
        if on_collect in gc.callbacks:
            gc.callbacks.remove(on_collect)
        for owner, name, original in reversed(patched):
            if original is None:
                delattr(owner, name)  # inherited: the base class's again
            else:
                setattr(owner, name, original)
    return elapsed / n, defaultdict(float, {k: v / n for k, v in spent.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=5000, help="decisions to time")
    parser.add_argument("--skeleton", type=Path, default=SKELETON, help="the reference skeleton's file")
    parser.add_argument("--parts", action="store_true", help="then time the engine's parts (GC on and off)")
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=20_000,
        help="then the engine again with the collector's youngest generation at this threshold (0: not)",
    )
    args = parser.parse_args()
    rate, cpu_rate, templates = asyncio.run(decisions_per_second(args.n))
    validate = validation_seconds(args.n)
    stages = floor_seconds(templates, args.n)
    floor = 1 / (validate + stages["build"] + stages["canonical"] + stages["hash"])
    legacy_floor = 1 / (validate + stages["build"] + stages["legacy"] + stages["hash"])
    python_floor = 1 / (validate + stages["build"] + stages["python_jcs"] + stages["hash"])
    writer = "compiled, native/" if chain._native_jcs is not None else "orjson and Python: native/ not built"
    skeleton = skeleton_rate(args.n, args.skeleton)
    events = len(templates)
    print(
        f"engine: {rate:,.0f} decisions/s ({events} events each, {rate * events:,.0f} events/s); "
        f"{cpu_rate:,.0f}/s of its CPU time"
    )
    print(
        f"floor: {floor:,.0f} decisions/s -- per decision: input validation {validate * 1e6:.1f} us, event "
        f"building {stages['build'] * 1e6:.1f} us, canonical form (RFC 8785, {writer}) "
        f"{stages['canonical'] * 1e6:.1f} us, hashing {stages['hash'] * 1e6:.1f} us"
    )
    sealed_floor = 1 / (validate + stages["build"] + stages["sealed"])  # nan: native/ not built
    if sealed_floor == sealed_floor:
        print(
            f"floor with canonical form and hash in one compiled pass (native/ jcs_sealed, as the engine seals): "
            f"{sealed_floor:,.0f} decisions/s (the two {stages['sealed'] * 1e6:.1f} us)"
        )
    print(
        f"floor with RFC 8785 written in Python (orjson where the key orders agree): {python_floor:,.0f} "
        f"decisions/s (its canonical form {stages['python_jcs'] * 1e6:.1f} us)"
    )
    print(
        f"floor with the versions 1-2 form (json.dumps): {legacy_floor:,.0f} decisions/s "
        f"(its canonical form {stages['legacy'] * 1e6:.1f} us)"
    )
    print(f"engine: {rate / floor:.3f}x of the floor")
    if isinstance(skeleton, str):
        print(f"skeleton: {skeleton}")
    else:
        wall, cpu = skeleton
        print(f"skeleton: {wall:,.0f} decisions/s (node, same run); {cpu:,.0f}/s of its CPU time")
        print(
            f"engine: {rate / wall:.3f}x of the skeleton (target >= 0.15x); by CPU time {cpu_rate / cpu:.3f}x "
            "(less disturbed by other load on the machine)"
        )
        print(
            f"floor: {floor / wall:.3f}x of the skeleton (target >= 0.5x); with the canonical form in Python "
            f"{python_floor / wall:.3f}x"
        )
        if sealed_floor == sealed_floor:
            print(f"floor with the one-pass compiled seal: {sealed_floor / wall:.3f}x of the skeleton")
    if args.gc_threshold:
        default = gc.get_threshold()
        gc.set_threshold(args.gc_threshold, *default[1:])
        try:
            tuned, tuned_cpu, _ = asyncio.run(decisions_per_second(args.n))
        finally:
            gc.set_threshold(*default)
        versus = (
            ""
            if isinstance(skeleton, str)
            else f": {tuned / skeleton[0]:.3f}x of the skeleton, by CPU time {tuned_cpu / skeleton[1]:.3f}x"
        )
        print(
            f"engine with gc.set_threshold({args.gc_threshold}, ...) (a host's start-up choice, not the engine's; "
            f"default {default[0]}): {tuned:,.0f} decisions/s, {tuned_cpu:,.0f}/s of its CPU time{versus}"
        )
    if args.parts:
        on_total, on = asyncio.run(parts(args.n, collect=True))
        off_total, off = asyncio.run(parts(args.n, collect=False))
        print(
            "the engine's parts, us of CPU time a decision (timers included), GC on / off: "
            f"{on_total * 1e6:.0f} / {off_total * 1e6:.0f}"
        )
        for label in [label for _owner, _name, label in _parts()] + [GC_LABEL, f"{GC_LABEL} (generation 2)"]:
            print(f"  {on[label] * 1e6:6.1f} / {off[label] * 1e6:6.1f}  {label}")


if __name__ == "__main__":
    main()
