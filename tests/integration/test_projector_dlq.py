"""The projector's dead-letter topic, on a real broker: every dead letter is also published, acknowledged
before the offsets that cover it commit.

What must hold: each row of `dead_letters` is one record on ``<topic>.projector.dlq`` carrying the
original key and value (base64), the code and reason, and where the message was read; reading the log
again publishes nothing again; a batch that fails after publishing (a crash before COMMIT) leaves the
record on the topic and nothing in the database, and the restarted projector dead-letters the message
again -- a second record for the same offset, which a consumer deduplicates by (topic, partition, offset).
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.brokers import Broker, delete_topics
from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import encode_message
from projections import Projector, log_end_offsets, open_database, reset_offsets
from projections.dlq import DEAD_LETTER_VERSION
from tests.integration.test_projector import KEY, PHASE_TIMEOUT_S, ends_of, publish_raw, table

pytestmark = pytest.mark.integration


async def dead_letter_records(bootstrap: str, dlq: str) -> list[tuple[bytes | None, dict[str, Any], dict[str, bytes]]]:
    """Every record on the (one-partition) dead-letter topic: key, JSON value, headers."""
    (end,) = (await log_end_offsets(bootstrap, dlq, [0])).values()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tp = TopicPartition(dlq, 0)
    records: list[tuple[bytes | None, dict[str, Any], dict[str, bytes]]] = []
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            while await consumer.position(tp) < end:
                for batch in (await consumer.getmany(tp, timeout_ms=500)).values():
                    for record in batch:
                        assert record.value is not None
                        headers = {name: bytes(value) for name, value in record.headers or ()}
                        records.append((record.key, json.loads(record.value), headers))
    finally:
        await consumer.stop()
    return records


def bad_messages() -> list[tuple[bytes | None, bytes | None]]:
    k = KEY.encode()
    return [(k, b"\xff\x00 not json"), (k, None), (None, b"[]"), (k, b'{"event_type": "run_started"}')]


class TestDeadLetterTopic:
    """Each dead letter is a row and a record on the dead-letter topic, published once per committed row."""

    async def test_every_dead_letter_is_published_with_its_bytes_reason_and_source(
        self, broker: Broker, topic: str, tmp_path: Path
    ) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        good = await pf.run(sc.transfer())
        sent = [(KEY.encode(), encode_message(good.run_events)), *bad_messages()]
        acked = await publish_raw(broker.bootstrap_servers, topic, sent)
        db = tmp_path / "p.duckdb"
        async with Projector(db, broker.bootstrap_servers, topic) as projector:
            assert projector.dead_letter_topic == f"{topic}.projector.dlq"
            stats = await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
        assert (stats.counts["runs"], stats.counts["dead_letters"], stats.counts["dead_letters_published"]) == (1, 4, 4)

        rows = {(r["partition"], r["offset"]): r for r in table(db, "dead_letters")}
        records = await dead_letter_records(broker.bootstrap_servers, f"{topic}.projector.dlq")
        assert len(records) == len(rows) == 4
        for (key, value), position in zip(sent[1:], acked[1:], strict=True):
            row = rows[position]
            ((record_key, record, headers),) = [r for r in records if (r[1]["partition"], r[1]["offset"]) == position]
            assert record_key == key and headers["dead_letter_code"] == row["code"].encode()
            assert record["dead_letter_version"] == DEAD_LETTER_VERSION and record["topic"] == topic
            assert record["reason"] == f"{row['code']}: {row['reason']}"
            assert record["value_b64"] == (base64.b64encode(value).decode() if value is not None else None)
            assert record["key_b64"] == (base64.b64encode(key).decode() if key is not None else None)
            assert record["key"] == (key.decode() if key is not None else None) and record["end_offset"] is None

    async def test_reading_the_log_again_publishes_nothing_again(
        self, broker: Broker, topic: str, tmp_path: Path
    ) -> None:
        acked = await publish_raw(broker.bootstrap_servers, topic, bad_messages())
        db = tmp_path / "p.duckdb"
        for _ in range(2):
            async with Projector(db, broker.bootstrap_servers, topic) as projector:
                await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
            con = open_database(db)
            try:
                reset_offsets(con, "preflight-projector", topic)
            finally:
                con.close()
        async with Projector(db, broker.bootstrap_servers, topic, group_id="another-projection") as projector:
            stats = await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
        assert stats.counts["dead_letters"] == 4 and stats.counts["dead_letters_published"] == 0
        assert len(table(db, "dead_letters")) == 4
        assert len(await dead_letter_records(broker.bootstrap_servers, f"{topic}.projector.dlq")) == 4

    async def test_the_record_is_acknowledged_before_the_offsets_commit(
        self, broker: Broker, topic: str, tmp_path: Path
    ) -> None:
        """A crash after the publish and before COMMIT: the record is on the topic, the database holds
        nothing; the restarted projector dead-letters the message again (a documented duplicate)."""
        (bad,) = bad_messages()[:1]
        acked = await publish_raw(broker.bootstrap_servers, topic, [bad])
        db = tmp_path / "p.duckdb"
        dlq = f"{topic}.projector.dlq"

        def crash() -> None:
            raise RuntimeError("killed between the publish and COMMIT")

        async with Projector(db, broker.bootstrap_servers, topic, before_commit=crash) as projector:
            with pytest.raises(RuntimeError, match="killed"):
                await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
        assert table(db, "dead_letters") == [] and table(db, "consumer_offsets") == []
        (first,) = await dead_letter_records(broker.bootstrap_servers, dlq)
        assert (first[1]["partition"], first[1]["offset"]) == acked[0]

        async with Projector(db, broker.bootstrap_servers, topic) as projector:
            await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
        assert len(table(db, "dead_letters")) == 1
        records = await dead_letter_records(broker.bootstrap_servers, dlq)
        assert [r[1] for r in records] == [first[1], first[1]]

    async def test_a_configured_topic_or_none(self, broker: Broker, topic: str, tmp_path: Path) -> None:
        acked = await publish_raw(broker.bootstrap_servers, topic, bad_messages()[:2])
        named = f"it.dlq.{uuid.uuid4().hex[:12]}"
        try:
            async with Projector(
                tmp_path / "a.duckdb", broker.bootstrap_servers, topic, dead_letter_topic=named
            ) as projector:
                await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
            assert len(await dead_letter_records(broker.bootstrap_servers, named)) == 2
        finally:
            await delete_topics(broker.bootstrap_servers, [named])
        async with Projector(
            tmp_path / "b.duckdb", broker.bootstrap_servers, topic, publish_dead_letters=False
        ) as projector:
            assert projector.dead_letter_topic is None
            stats = await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
        assert (stats.counts["dead_letters"], stats.counts["dead_letters_published"]) == (2, 0)
        with pytest.raises(ValueError, match="differ"):
            Projector(tmp_path / "c.duckdb", broker.bootstrap_servers, topic, dead_letter_topic=topic)
