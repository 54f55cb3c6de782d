"""The worker's pure parts: `streams.batch.fold_partition` (a partition's batch around `evolve`) and
`streams.view` (the HTTP answers), without Faust or a broker."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.chain import content_hash
from preflight.events import decode_message
from preflight.fold import UnrebuildableBaselineError, baseline_json
from preflight.intake import vouched
from preflight.records import UNKEYED_RECORD_KEY
from streams.batch import (
    DeadLetter,
    Incoming,
    Missing,
    PartitionFold,
    Progress,
    decode_value,
    fold_partition,
    state_key,
)
from streams.view import (
    BaselineQuery,
    QueryError,
    baseline_body,
    default_partition,
    key_partition,
    parse_query,
    totals,
)
from tests.unit.test_fold import KEY, history

TOPIC = "events"


def message(events: list[dict[str, Any]]) -> bytes:
    return json.dumps(events, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class Partition:
    """One partition's fold, its table kept in a dict the way the worker keeps it in its Faust table."""

    def __init__(self) -> None:
        self.table: dict[str, Any] = {}
        self.progress = Progress()

    def fold(self, items: list[Incoming | Missing]) -> PartitionFold:
        result = fold_partition(TOPIC, 0, items, self.progress, self.table.get)
        for key, state in result.writes.items():
            self.table[state_key(key)] = state
        self.progress = result.progress
        return result


def kafka_key(events: list[dict[str, Any]]) -> bytes:
    return str(events[0]["action_key"] or UNKEYED_RECORD_KEY).encode()


async def messages() -> list[tuple[bytes, bytes]]:
    """asked, ready (execute), its executed tail (all under KEY), and a hold stopped before the key is built."""
    h = await history()
    return [(kafka_key(h[name]), message(h[name])) for name in ("asked", "ready", "executed_tail", "held")]


class TestFoldPartition:
    async def test_folds_in_order_and_counts_every_offset_once(self) -> None:
        part = Partition()
        items: list[Incoming | Missing] = [Incoming(0, i, k, v) for i, (k, v) in enumerate(await messages())]
        result = part.fold(items)
        assert result.progress == Progress(offset=3, messages=4, applied=4)
        assert result.dead_letters == []
        assert result.baselines_changed == 1
        assert list(result.writes) == [KEY, UNKEYED_RECORD_KEY]
        assert baseline_json(part.table[state_key(KEY)]["baseline"])["execution_decision"] == "executed"

    async def test_redelivered_offsets_are_skipped_before_decoding(self) -> None:
        part = Partition()
        items: list[Incoming | Missing] = [Incoming(0, i, k, v) for i, (k, v) in enumerate(await messages())]
        part.fold(items[:3])
        before = json.dumps(part.table, sort_keys=True)
        # Offsets 0..2 again, with garbage values: a redelivery is never even decoded.
        garbage: list[Incoming | Missing] = [Incoming(0, i, KEY.encode(), b"not json") for i in range(3)]
        again = part.fold(garbage + items[3:])
        assert again.redelivered == 3
        assert again.dead_letters == []
        assert again.progress == Progress(offset=3, messages=4, applied=4)
        assert json.dumps({k: v for k, v in part.table.items()}, sort_keys=True) != before  # offset 3 applied

    @pytest.mark.parametrize(
        ("key", "value", "reason", "code"),
        [
            (None, b"[]", "no key", "no_key"),
            (b"\xff\xfe", b"[]", "not UTF-8", "undecodable"),
            (KEY.encode(), None, "tombstone", "tombstone"),
            (KEY.encode(), b"{not json", "undecodable", "undecodable"),
            (KEY.encode(), b"[]", "empty array", "not_an_event_array"),
            (KEY.encode(), b'[{"event_type":"mystery"}]', "unknown event_type", "unknown_event_type"),
        ],
    )
    async def test_bad_messages_become_dead_letters_with_their_bytes(
        self, key: bytes | None, value: bytes | None, reason: str, code: str
    ) -> None:
        part = Partition()
        good = await messages()
        items: list[Incoming | Missing] = [
            Incoming(0, 0, key, value),
            Incoming(0, 1, *good[0]),
        ]
        result = part.fold(items)
        assert [d.offset for d in result.dead_letters] == [0]
        letter = result.dead_letters[0]
        assert reason in letter.reason
        record = json.loads(letter.encode())
        assert record["offset"] == 0 and record["topic"] == TOPIC and record["partition"] == 0
        assert record["value_b64"] == (base64.b64encode(value).decode() if value is not None else None)
        assert record["key_b64"] == (base64.b64encode(key).decode() if key is not None else None)
        # The good message after it is folded: a bad one never stops the partition.
        assert result.progress.to_json() == {
            **Progress(offset=1, messages=2, applied=1, dead_letters=1).to_json(),
            "dead_letter_codes": {code: 1},
        }

    async def test_an_anomaly_changes_no_state(self) -> None:
        h = await history()
        part = Partition()
        part.fold([Incoming(0, 0, KEY.encode(), message(h["asked"]))])
        before = json.dumps(part.table, sort_keys=True)
        tampered = [dict(e) for e in h["ready"]]
        tampered[2]["seq"] = 7
        result = part.fold([Incoming(0, 1, KEY.encode(), message(tampered))])
        assert len(result.dead_letters) == 1 and "seq" in result.dead_letters[0].reason
        assert result.writes == {}
        assert json.dumps(part.table, sort_keys=True) == before
        assert result.progress.offset == 1  # the offset is passed, never re-read

    async def test_offsets_the_log_lost_are_one_dead_letter_spanning_them(self) -> None:
        part = Partition()
        good = await messages()
        result = part.fold([Incoming(0, 0, *good[0]), Missing(0, 1, 5), Incoming(0, 5, *good[1])])
        assert [(d.offset, d.end_offset) for d in result.dead_letters] == [(1, 4)]
        assert "no longer in the log" in result.dead_letters[0].reason
        assert result.progress == Progress(
            offset=5, messages=2, applied=2, dead_letters=1, missing=4, dead_letter_codes={"missing_offsets": 1}
        )

    async def test_a_hole_is_the_callers_bug_and_raises(self) -> None:
        part = Partition()
        good = await messages()
        with pytest.raises(ValueError, match="were not given"):
            part.fold([Incoming(0, 0, *good[0]), Incoming(0, 2, *good[1])])
        with pytest.raises(ValueError, match="partition"):
            fold_partition(TOPIC, 1, [Incoming(0, 0, *good[0])], Progress(), part.table.get)

    async def test_a_producer_retry_at_a_new_offset_is_a_duplicate(self) -> None:
        part = Partition()
        good = await messages()
        result = part.fold([Incoming(0, 0, *good[0]), Incoming(0, 1, *good[0])])
        assert result.progress == Progress(offset=1, messages=2, applied=2)
        assert part.table[state_key(KEY)]["counts"]["duplicates"] == 1
        assert result.re_read == 0

    async def test_a_state_ahead_of_its_watermark_is_re_read_not_a_duplicate(self) -> None:
        """A restart between a batch's state writes and its watermark: the messages the states already
        hold are read again, counted once (applied, as before), re-read -- never duplicates."""
        part = Partition()
        good = await messages()
        items: list[Incoming | Missing] = [Incoming(0, i, k, v) for i, (k, v) in enumerate(good)]
        part.fold(items)
        once = json.dumps(part.table, sort_keys=True)
        counted = part.progress
        part.progress = Progress()  # the watermark's write was lost; the states' writes were not
        again = part.fold(items)
        assert again.re_read == len(good)
        assert again.writes == {}
        assert again.progress == counted
        assert json.dumps(part.table, sort_keys=True) == once
        assert part.table[state_key(KEY)]["counts"]["duplicates"] == 0

    def test_progress_round_trips_and_tolerates_garbage(self) -> None:
        progress = Progress(
            offset=9, messages=10, applied=8, dead_letters=2, missing=0, dead_letter_codes={"tombstone": 2}
        )
        assert Progress.from_json(progress.to_json()) == progress
        assert Progress.from_json(None) == Progress()
        assert Progress.from_json("w:0") == Progress()

    def test_a_dead_letter_with_an_undecodable_key_keeps_its_bytes(self) -> None:
        letter = DeadLetter("why", TOPIC, 0, 3, b"\xff", b"\x00")
        record = letter.record()
        assert record["key"] is None and record["key_b64"] == "/w==" and record["value_b64"] == "AA=="


class TestView:
    def test_parse_query_bounds_and_refuses(self) -> None:
        q = parse_query("k", {"min_offset": "4", "partition": "1", "wait": "99"}, partitions=2, max_wait_s=5.0)
        assert q == BaselineQuery("k", 4, 1, 5.0)
        assert parse_query("k", {}, partitions=2, max_wait_s=5.0) == BaselineQuery("k", None, None, 5.0)
        for bad in ({"min_offset": "x"}, {"min_offset": "-1"}, {"partition": "2"}, {"wait": "soon"}):
            with pytest.raises(QueryError):
                parse_query("k", bad, partitions=2, max_wait_s=5.0)
        with pytest.raises(QueryError):
            parse_query("", {}, partitions=2, max_wait_s=5.0)

    def test_key_partition_prefers_the_request_then_the_state_then_the_partitioner(self) -> None:
        q = BaselineQuery("k", None, None, 1.0)
        assert key_partition(BaselineQuery("k", None, 1, 1.0), {"partition": 0}, 2) == 1
        assert key_partition(q, {"partition": 1}, 2) == 1
        assert key_partition(q, None, 2) == default_partition("k", 2)

    @pytest.mark.parametrize(
        ("key", "partition"), [("", 681), ("a", 524), ("ab", 434), ("abc", 107), ("123456789", 566)]
    )
    def test_default_partition_matches_the_java_client(self, key: str, partition: int) -> None:
        """Vectors from the Java client's default partitioner over 1,000 partitions."""
        assert default_partition(key, 1000) == partition

    async def test_baseline_body_from_a_folded_state(self) -> None:
        part = Partition()
        items: list[Incoming | Missing] = [Incoming(0, i, k, v) for i, (k, v) in enumerate(await messages())]
        part.fold(items)
        state: Mapping[str, Any] = part.table[state_key(KEY)]
        body = baseline_body(KEY, state, 0, part.progress)
        assert body["status"] == "ok"
        assert body["offset"] == 2 and body["partition"] == 0  # where the executed tail was read
        assert body["record"]["execution_decision"] == "executed"
        assert body["folded"] == {"partition": 0, "offset": 3}
        none = baseline_body("other", None, 0, part.progress)
        assert none["status"] == "none" and none["record"] is None

    async def test_totals_sum_every_state(self) -> None:
        part = Partition()
        items: list[Incoming | Missing] = [Incoming(0, i, k, v) for i, (k, v) in enumerate(await messages())]
        part.fold(items)
        summed = totals({k: v for k, v in part.table.items()})
        assert summed["keys"] == 2 and summed["baselines"] == 1
        assert summed["runs"] == 3 and summed["executed"] == 1 and summed["ask_user"] == 1 and summed["hold"] == 1


def _rehashed(events: list[dict[str, Any]], index: int, name: str, value: Any) -> list[dict[str, Any]]:
    """`events` with member `name` of event `index` set to `value` (deleted for `_DELETE`) and the chain's
    hashes recomputed: a message whose hashes match but whose content may break the contract."""
    changed = [dict(e) for e in events]
    if value is _DELETE:
        changed[index].pop(name, None)
    else:
        changed[index][name] = value
    prev = changed[0]["prev_hash"]
    for event in changed:
        event["prev_hash"] = prev
        event.pop("hash", None)
        event["hash"] = content_hash(prev, event)
        prev = event["hash"]
    return changed


_DELETE = object()
#: Values a member may be set to: of another type, out of the contract's form, beyond what the shapes judge.
_VALUES = st.sampled_from(
    [_DELETE, None, 0, -1, 2**40, 1.5, True, "", "x", "not-a-uuid", "2026-13-45T00:00:00Z", [], {}, {"a": 1}, 99]
)


def _no_state(key: str) -> Mapping[str, Any] | None:
    return None


class TestIntakePaths:
    """The fold's verdict is the same whichever path a message takes: vouched for by the consumers' shared intake
    check (`preflight.intake`, compiled where built) or judged event by event by the reference path."""

    async def test_canonical_messages_are_vouched_for(self) -> None:
        for _, value in await messages():
            assert vouched(value) is not None

    @settings(max_examples=150, deadline=None)
    @given(data=st.data())
    async def test_both_paths_give_the_same_states_and_dead_letters(self, data: st.DataObject) -> None:
        h = await history()
        names = ("asked", "ready", "executed_tail", "held")
        target = data.draw(st.sampled_from(names))
        events = h[target]
        index = data.draw(st.integers(0, len(events) - 1))
        member = data.draw(st.sampled_from(sorted(set(events[index]) - {"hash", "prev_hash"})))
        altered = dict(h, **{target: _rehashed(events, index, member, data.draw(_VALUES))})
        raw = message(altered[target])
        if data.draw(st.booleans()):  # or a byte of it flipped: broken JSON, a hash that no longer matches
            at = data.draw(st.integers(0, len(raw) - 1))
            raw = raw[:at] + data.draw(st.sampled_from([b"0", b"a", b'"', b"}", b"\\", b" "])) + raw[at + 1 :]
        values = [raw if name == target else message(altered[name]) for name in names]
        items: list[Incoming | Missing] = [
            Incoming(0, i, kafka_key(h[name]), v) for i, (name, v) in enumerate(zip(names, values, strict=True))
        ]
        vouching = fold_partition(TOPIC, 0, items, Progress(), _no_state, decode_value)
        reference = fold_partition(TOPIC, 0, items, Progress(), _no_state, decode_message)
        assert [(d.offset, d.dead_letter_code, d.reason) for d in vouching.dead_letters] == [
            (d.offset, d.dead_letter_code, d.reason) for d in reference.dead_letters
        ]
        assert vouching.progress == reference.progress
        assert json.dumps(vouching.writes, sort_keys=True) == json.dumps(reference.writes, sort_keys=True)
        assert vouching.records == reference.records


class TestBaselineRebuiltOnRead:
    """The fold keeps an executed run's events as the baseline; its record is rebuilt when read."""

    async def test_the_record_is_rebuilt_from_the_events_once_and_equals_the_engines(self) -> None:
        part = Partition()
        part.fold([Incoming(0, i, k, v) for i, (k, v) in enumerate(await messages())])
        base = part.table[state_key(KEY)]["baseline"]
        assert "record" not in base and base["events"][-1]["event_type"] == "executed"
        record = baseline_json(base)
        assert baseline_json(dict(base)) is record  # remembered, not rebuilt again
        h = await history()
        assert record == baseline_json({**base, "record": record})
        assert {f["name"] for f in record["fields"]} == {
            e["field"]["name"] for e in h["ready"] if e["event_type"] == "field_resolved"
        }

    async def test_events_that_do_not_rebuild_give_no_baseline_rather_than_a_wrong_one(self) -> None:
        part = Partition()
        part.fold([Incoming(0, i, k, v) for i, (k, v) in enumerate(await messages())])
        state = dict(part.table[state_key(KEY)])
        base = state["baseline"]
        broken = {
            **base,
            "last_hash": "f" * 64,
            "events": [e for e in base["events"] if e["event_type"] != "run_closed"],
        }
        with pytest.raises(UnrebuildableBaselineError):
            baseline_json(broken)
        with pytest.raises(UnrebuildableBaselineError):
            baseline_body(KEY, {**state, "baseline": broken}, 0, Progress())
