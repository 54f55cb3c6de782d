"""The ledger over an archive the real projector filled from a real broker.

What must hold: engine -> KafkaEventSink -> broker -> projector -> DuckDB file, then ``digest`` while
the projector is stopped, verifies; events archived later are "not yet covered", not tampered; the
projector resumes, ``digest`` goes on from its last digest and seals the rest, and everything is
covered; an archived event deleted behind the projector's back is reported as the first bad event,
with its id, and the command exits 1.

A fresh topic with two partitions (created explicitly, deleted after) and a fresh DuckDB file per test.
"""

from __future__ import annotations

import io
from pathlib import Path

import duckdb
import pytest

from infra.brokers import Broker
from ledger import SigningKey, digest_file
from ledger.cli import EXIT_TAMPERED, main
from ledger.verify import verify
from preflight import MemoryStorage, Preflight, create_preflight
from preflight import scenario as sc
from preflight.adapters.kafka import KafkaEventSink
from projections import Projector

pytestmark = pytest.mark.integration

PARTITIONS = 2
PHASE_TIMEOUT_S = 90.0


async def publish_runs(pf: Preflight, users: range) -> None:
    """Per user: asked for a value, then answered and executed (three messages)."""
    for i in users:
        user = f"u_{i:03d}"
        await pf.run_and_record(sc.transfer(user_id=user))
        ready = await pf.run_and_record(sc.transfer(user_id=user, user_answers={"to_account": "2200119"}))
        done = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda name, args: {"ok": True})
        assert done.status == "executed"


def ends(sink: KafkaEventSink) -> dict[int, int]:
    found: dict[int, int] = {}
    for partition, offset in sink.acked_positions().values():
        found[partition] = max(found.get(partition, 0), offset + 1)
    return found


async def project(broker: Broker, topic: str, db: Path, until: dict[int, int]) -> None:
    async with Projector(db, broker.bootstrap_servers, topic, group_id="ledger", batch_size=50) as projector:
        await projector.run_until(until, timeout_s=PHASE_TIMEOUT_S)


async def test_a_projected_archive_is_digested_verified_and_its_tampering_found(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    db = tmp_path / "projections.duckdb"
    key = SigningKey.generate()
    keys = [key.verify_key]
    async with KafkaEventSink(broker.bootstrap_servers, topic) as sink:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=sink)
        await publish_runs(pf, range(0, 8))
        await project(broker, topic, db, ends(sink))

        first = digest_file(db, key, span_events=20)
        assert first.filed >= 2
        report = verify(db, keys)
        assert report.ok and not report.tampered, report.lines()
        assert report.covered == first.events and report.uncovered == sum(s.pending for s in first.streams) > 0

        await publish_runs(pf, range(8, 14))
        await project(broker, topic, db, ends(sink))  # the projector resumes from its stored offsets
        assert verify(db, keys).uncovered > report.uncovered  # new events: not yet covered, not tampered

        sealed = digest_file(db, key, span_events=20, final=True)
        assert sealed.filed >= 1 and all(s.pending == 0 for s in sealed.streams)
        full = verify(db, keys, require_full_coverage=True)
        assert full.ok and full.uncovered == 0 and full.events == full.covered
        assert full.runs == 14 * 2

    con = duckdb.connect(str(db))
    try:
        partition, offset, index, event_id = con.execute(
            'SELECT partition, "offset", message_index, CAST(event_id AS VARCHAR) FROM archive'
            " WHERE event_type = 'field_resolved' ORDER BY partition, \"offset\", message_index LIMIT 1 OFFSET 3"
        ).fetchone()  # type: ignore[misc]
        con.execute("DELETE FROM archive WHERE event_id = ?", [event_id])
    finally:
        con.close()
    tampered = verify(db, keys)
    assert not tampered.ok and tampered.first_bad is not None
    first_bad = tampered.first_bad
    assert (first_bad.kind, first_bad.partition, first_bad.offset, first_bad.message_index, first_bad.event_id) == (
        "event_missing",
        partition,
        offset,
        index,
        event_id,
    )
    public = tmp_path / "ledger.pub"
    public.write_bytes(key.verify_key.pem())
    out = io.StringIO()
    assert main(["verify", str(db), "--public-key", str(public)], {}, out, io.StringIO()) == EXIT_TAMPERED
    assert event_id in out.getvalue()
