"""Fuzzing (hypothesis) the consumers' message decoders and the engine's inputs.

The consumers: the worker's `streams.batch.fold_partition` (decode + `preflight.fold.evolve`, per
message) and the projector's `projections.decode.decode_incoming`. What must hold for any message:

* neither raises; the worker accounts for every offset exactly once (applied, duplicate or dead letter,
  the watermark one further per message), and a dead letter keeps the original bytes;
* a good run among garbage is still applied; a refusal from the projector carries a known code;
* a message altered without sealing its chain again is refused by both (tamper evidence);
* a message the projector refuses is not folded by the worker either (they must agree, or a baseline
  can rest on a run the archive does not hold).

The engine: whatever it is given as input, `run` decides (one of the four decisions), its events form
one intact chain, and both consumers accept the message -- and the outcome message after an execute.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import TAIL_EVENT_TYPES, content_hash, encode_message, kafka_key, verify_run
from preflight.verdict import CODES
from projections.decode import Incoming as ProjectorIncoming
from projections.decode import Rejected, decode_incoming
from streams.batch import Incoming as WorkerIncoming
from streams.batch import Progress, fold_partition
from tests.reliability.harness import Agents, Message, MessageSink, RunSource

pytestmark = pytest.mark.reliability

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOPIC = "fuzz.events"
#: Every code the projector gives a message it cannot project (projections/README.md).
PROJECTOR_CODES = frozenset(
    {
        "tombstone",
        "no_key",
        "undecodable",
        "not_an_event_array",
        "unknown_event_type",
        "unsupported_schema_version",
        "malformed_event",
        "event_id_not_uuid",
        "broken_chain",
        "incomplete_run",
        "mixed_runs",
        "key_mismatch",
        "unprojectable",
        "run_id_conflict",
        "event_id_reused",
        "outcome_without_run",
        "outcome_for_non_execute",
        "outcome_mismatch",
        "second_outcome",
        *CODES,  # the contract's verdict, shared with the fold (`preflight.verdict`)
    }
)


@cache
def corpus() -> tuple[Message, ...]:
    """Real messages: runs of every decision and their outcomes, over four keys."""
    sink = MessageSink()
    asyncio.run(Agents(sink).publish(RunSource(users=4, prefix="f").take(18)))
    return tuple(sink.messages)


def _runs() -> list[Message]:
    return [m for m in corpus() if m[0].event_type not in TAIL_EVENT_TYPES]


def _wire(message: Message) -> tuple[bytes, bytes]:
    return kafka_key(message).encode(), encode_message(message)


def _fold(messages: list[tuple[bytes | None, bytes | None]]) -> Any:
    items = [WorkerIncoming(0, offset, key, value) for offset, (key, value) in enumerate(messages)]
    states: dict[str, Any] = {}
    return fold_partition(TOPIC, 0, items, Progress(), states.get)


def _project(key: bytes | None, value: bytes | None) -> Any:
    return decode_incoming(ProjectorIncoming(TOPIC, 0, 0, key, value))


def _folded(key: bytes | None, value: bytes | None) -> bool:
    """Whether the worker applies (or counts as a duplicate) the message rather than dead-lettering it."""
    return not _fold([(key, value)]).dead_letters


# ---- strategies ---------------------------------------------------------------------------------------------

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _flip(data: bytes, at: int, bit: int) -> bytes:
    if not data:
        return data
    at %= len(data)
    return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]


@st.composite
def garbage(draw: st.DrawFn) -> tuple[bytes | None, bytes | None]:
    """A message that is anything: random bytes, a real one damaged at the byte level, or a real one."""
    choice = draw(st.integers(0, 4))
    key = draw(st.sampled_from([None, b"\xff", b"f_00:bank.transfer", b"f_01:bank.transfer"]))
    if choice == 0:
        return key, draw(st.one_of(st.none(), st.binary(max_size=300)))
    message = draw(st.sampled_from(corpus()))
    real_key, value = _wire(message)
    if choice == 1:
        return real_key, value[: draw(st.integers(0, max(0, len(value) - 1)))]
    if choice == 2:
        return real_key, _flip(value, draw(st.integers(0, 10**6)), draw(st.integers(0, 7)))
    if choice == 3:
        return real_key, json.dumps(draw(json_values)).encode()
    return real_key, value


@st.composite
def altered(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A real run as JSON, and a copy with one change somewhere in one event (key, value or type)."""
    original = [e.model_dump(mode="json") for e in draw(st.sampled_from(_runs()))]
    changed = json.loads(json.dumps(original))
    event = draw(st.sampled_from(changed))
    path: list[Any] = []
    node: Any = event
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
        step = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append(step)
        node = node[step]
    parent: Any = event
    for step in path[:-1]:
        parent = parent[step]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if not path or action == "add":
        target = node if isinstance(node, dict) and path else event
        target[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    elif action == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return original, changed


def _resealed(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    prev = "0" * 64
    out = []
    for event in raw:
        body = {k: v for k, v in event.items() if k != "hash"} | {"prev_hash": prev}
        try:
            prev = content_hash(prev, body)
        except (TypeError, ValueError):
            return raw
        out.append(body | {"hash": prev})
    return out


def _canonical(raw: list[dict[str, Any]]) -> bytes:
    return json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# ---- the consumers --------------------------------------------------------------------------------------------


@FUZZ
@given(st.lists(garbage(), min_size=1, max_size=8), st.integers(0, 8))
def test_every_message_is_folded_or_dead_lettered_and_good_runs_still_fold(
    messages: list[tuple[bytes | None, bytes | None]], where: int
) -> None:
    good = _runs()[where % len(_runs())]
    messages.insert(where % (len(messages) + 1), _wire(good))
    result = _fold(messages)
    progress = result.progress
    assert (progress.offset, progress.messages) == (len(messages) - 1, len(messages))
    assert progress.applied + progress.dead_letters == len(messages)
    assert sum(progress.dead_letter_codes.values()) == progress.dead_letters
    assert "other" not in progress.dead_letter_codes, [letter.reason for letter in result.dead_letters]
    offsets = [letter.offset for letter in result.dead_letters]
    assert len(offsets) == len(set(offsets)) == progress.dead_letters
    for letter in result.dead_letters:
        assert (letter.key, letter.value) == messages[letter.offset]
        assert letter.reason
        assert json.loads(letter.encode())["value_b64"] == (
            base64.b64encode(letter.value).decode() if letter.value is not None else None
        )
    first_copy = messages.index(_wire(good))
    assert first_copy not in offsets, "a good run was dead-lettered"


@FUZZ
@given(garbage())
def test_the_projector_decodes_or_rejects_every_message_with_a_known_code(
    message: tuple[bytes | None, bytes | None],
) -> None:
    decoded = _project(*message)
    if isinstance(decoded, Rejected):
        assert decoded.code in PROJECTOR_CODES, decoded.code
        assert decoded.reason


@FUZZ
@given(altered())
def test_an_event_altered_without_sealing_again_is_refused_by_both(
    case: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    original, changed = case
    if _canonical(changed) == _canonical(original):
        return  # the change changed nothing that is hashed
    key, value = original[0]["action_key"].encode(), json.dumps(changed).encode()
    assert not _folded(key, value), "the worker folded an altered run"
    assert isinstance(_project(key, value), Rejected), "the projector accepted an altered run"


@settings(FUZZ, derandomize=True)
@given(altered())
def test_a_run_the_projector_refuses_is_not_folded_by_the_worker(
    case: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    _, changed = case
    value = json.dumps(_resealed(changed)).encode()
    key = (changed[0].get("action_key") or "").encode() if isinstance(changed[0].get("action_key"), str) else None
    if isinstance(_project(key, value), Rejected):
        assert not _folded(key, value), "the worker folded a run the projector dead-letters"


# ---- the engine ---------------------------------------------------------------------------------------------

texts = st.text(max_size=40)
trusts = st.sampled_from(["user", "untrusted", "system", "", None])
segments = st.fixed_dictionaries(
    {"text": texts, "trust": trusts}, optional={"origin": st.one_of(st.none(), st.text(max_size=8))}
)
field_names = st.sampled_from(["from_account", "amount", "to_account", "memo", ""])
wrappers = st.fixed_dictionaries({"value": json_values, "trust": trusts}, optional={"origin": texts})
schemas = st.one_of(
    st.none(),
    json_values,
    st.fixed_dictionaries(
        {"type": st.just("object")},
        optional={
            "required": st.lists(field_names, max_size=4),
            "properties": st.dictionaries(field_names, st.dictionaries(st.sampled_from(["type"]), texts), max_size=3),
        },
    ),
)


@st.composite
def run_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """The bank transfer's input with any of its parts replaced by something arbitrary."""
    inputs = sc.transfer()
    tool: dict[str, Any] = dict(sc.BANK_TOOL)
    candidates: dict[str, st.SearchStrategy[Any]] = {
        "user_id": st.one_of(st.none(), texts),
        "instruction": st.one_of(texts, st.lists(segments, max_size=3), json_values),
        "pre_set_data": st.one_of(st.dictionaries(field_names, wrappers, max_size=3), json_values),
        "measured_data": st.dictionaries(field_names, json_values, max_size=3),
        "user_answers": st.one_of(st.dictionaries(field_names, json_values, max_size=3), json_values),
        "user_checklist": st.lists(
            st.fixed_dictionaries({}, optional={"id": st.one_of(texts, json_values), "description": texts}),
            max_size=3,
        ),
        "intent_attempt": st.integers(-3, 2**40),
        "tool_attempt": st.integers(-3, 2**40),
        "agent_id": st.one_of(st.none(), texts),
    }
    for name in draw(st.sets(st.sampled_from(sorted(candidates)), max_size=4)):
        inputs[name] = draw(candidates[name])
    if draw(st.booleans()):
        schema = draw(schemas)
        if schema is None:
            tool.pop("inputSchema")
        else:
            tool["inputSchema"] = schema
    inputs["tool"] = tool
    return inputs


def _both_accept(message: Message) -> None:
    key, value = _wire(message)
    decoded = _project(key, value)
    assert not isinstance(decoded, Rejected), f"the projector refuses the engine's own message: {decoded.reason}"
    assert _folded(key, value), f"the worker dead-letters the engine's own message: {_fold([(key, value)])}"


@FUZZ
@given(run_inputs(), st.booleans())
def test_whatever_the_engine_is_given_it_decides_and_both_consumers_accept_its_events(
    inputs: dict[str, Any], answer_everything: bool
) -> None:
    hooks = sc.hooks() if answer_everything else sc.hooks(extract_from_instruction=_extract_anything)
    pf = create_preflight(hooks=hooks, storage=MemoryStorage())

    async def decide_and_execute() -> tuple[Any, Any]:
        state = await pf.run_and_record(inputs)
        done = None
        if state.execution_decision == "execute":
            done = await pf.execute_if_ready(state, inputs["tool"], lambda name, args: {"ok": True})
        return state, done

    state, done = asyncio.run(decide_and_execute())
    assert state.execution_decision in ("execute", "ask_user", "hold", "deferred"), state.execution_decision
    events = tuple(state.run_events)
    verify_run(events)
    _both_accept(events)
    if done is not None and done.status != "held":
        tail = (done.state.run_events[-1],)
        key, value = _wire(tail)
        result = _fold([_wire(events), (key, value)])
        assert not result.dead_letters, result.dead_letters
        assert not isinstance(_project(key, value), Rejected)


def _extract_anything(field: str, instruction: Any) -> Any:
    """An instruction hook that answers every field with something, valid or not."""
    answers: dict[str, Callable[[], Any]] = {
        "amount": lambda: {"value": 2**70, "segment_index": 0, "span": [0, 1]},
        "to_account": lambda: {"value": "x", "segment_index": 5, "span": [0, 1]},
        "from_account": lambda: {"value": 1.5, "segment_index": 0, "span": [3, 1]},
    }
    return answers.get(field, lambda: None)()
