"""PostgreSQL's database source takes in one statement (``inbox.sql.ingest.take_into_inbox``):
the rows it writes must be, column for column, the rows ``InboxIngest`` writes for the same
outbox rows (the path MariaDB and SQLite take), and it must lock, skip, limit, count and wake
as that path does."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg.sql
from sqlalchemy import Engine, func, select

import outbox
from inbox import Consumer
from inbox.ingest import InboxIngest, IngestResult, wake_payload
from inbox.sources.database import DatabaseSource
from outbox import states
from outbox.queries import message_columns
from outbox.schema import inbox_sequences_table, inbox_table, outbox_table
from outbox.wire import envelope_from_row

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
# Every column the take writes; ``id`` and ``duplicates`` are the database's own.
WRITTEN = (
    "event_id", "consumer", "queue", "priority", "serial_group", "seq", "type", "payload",
    "headers", "state", "attempts", "available_at", "last_error", "occurred_at",
    "received_at", "finished_at", "effect_key", "sequence_key", "sequence", "schema_version",
)  # fmt: skip


def _consumer() -> Consumer:
    consumer = Consumer("billing", queues=["jobs", "mail"])

    @consumer.handler("job")
    def job(session: Any, message: Any) -> None:  # never run here
        raise AssertionError("not run by a take")

    return consumer


def _store_variety(engine: Engine) -> None:
    """One message of every shape the take must copy: keys and headers, groups, the
    message contract, unicode, priorities, types no handler takes, one queue not ours, and
    one not yet due."""
    with engine.begin() as conn:
        outbox.store(conn, "jobs", "job", {"plain": 1})
        outbox.store(conn, "jobs", "job", {"k": 1}, key="k-1", headers={"trace": "t-1"})
        outbox.store(conn, "jobs", "job", {}, key="k-2", headers={"a": "1", "b": ""})
        outbox.store(conn, "jobs", "job", {"g": [1, {"x": None}]}, serial_group="g-1", priority=3)
        outbox.store(conn, "mail", "job", {"text": "grüße, 東京 \u2028"}, priority=2)
        outbox.store_many(
            conn,
            [
                outbox.Message("jobs", "job", {"i": i}, effect_key=f"e-{i}", sequence_key="s-1")
                for i in range(2)
            ],
        )
        outbox.store(conn, "jobs", "job", {}, sequence_key="s-2", sequence=40, schema_version="v2")
        outbox.store(conn, "jobs", "nobody.handles.this", {"lost": False})
        outbox.store(conn, "jobs", "it's \\ odd", {}, priority=9)
        outbox.store(conn, "other", "job", {"not": "ours"})
        outbox.store(conn, "jobs", "job", {"later": True}, delay=timedelta(days=3650))


def _due_rows(engine: Engine, consumer: Consumer) -> list[Any]:
    o = outbox_table.c
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(*message_columns(outbox_table))
                .where(
                    o.status == states.PENDING,
                    o.queue.in_(consumer.queues),
                    o.available_at <= NOW + timedelta(days=1),
                )
                .order_by(o.priority, o.id)
            )
        )


def _expected(engine: Engine, consumer: Consumer, rows: list[Any]) -> dict[Any, dict[str, Any]]:
    """What ``InboxIngest`` (the Python path) writes for these outbox rows."""
    ingest = InboxIngest(consumer, engine, clock=lambda: NOW)
    expected = {}
    for r in rows:
        row = ingest._row(envelope_from_row(r._mapping), NOW)
        row["payload"] = json.loads(row["payload"])
        row["headers"] = json.loads(row["headers"])
        expected[row["event_id"]] = row
    return expected


def _inbox(engine: Engine) -> dict[Any, dict[str, Any]]:
    with engine.connect() as conn:
        found = conn.execute(select(inbox_table)).mappings().all()
    return {r["event_id"]: dict(r) for r in found}


def _source(engine: Engine, consumer: Consumer, later: bool = True) -> DatabaseSource:
    # A clock a day on: every stored row is due except the one ten years away.
    moment = NOW + timedelta(days=1) if later else NOW
    return DatabaseSource(engine, consumer.queues, clock=lambda: moment)


def _recording(engine: Engine, consumer: Consumer) -> tuple[InboxIngest, list[IngestResult]]:
    ingest = InboxIngest(consumer, engine)
    results: list[IngestResult] = []
    ingest.on_ingested = results.append
    return ingest, results


def test_the_rows_written_are_the_ingests_rows(pg_engine: Engine) -> None:
    consumer = _consumer()
    _store_variety(pg_engine)
    due = _due_rows(pg_engine, consumer)
    expected = _expected(pg_engine, consumer, due)
    ingest, results = _recording(pg_engine, consumer)

    taken = _source(pg_engine, consumer).run_once(ingest, 100, 0.0)

    assert taken == len(due) == 10
    inbox = _inbox(pg_engine)
    assert set(inbox) == set(expected)
    moment = NOW + timedelta(days=1)
    for event_id, row in expected.items():
        # The Python path stamps its own clock; the take the source's: compare both as the
        # source's moment.
        for column in ("available_at", "received_at"):
            row[column] = moment
        if row["finished_at"] is not None:
            row["finished_at"] = moment
        assert {c: inbox[event_id][c] for c in WRITTEN} == {c: row[c] for c in WRITTEN}
        assert inbox[event_id]["duplicates"] == 0
    failed = [r for r in inbox.values() if r["state"] == states.FAILED]
    assert sorted(r["last_error"] for r in failed) == [
        "unknown message type 'it''s \\ odd': consumer 'billing' has no handler for it",
        "unknown message type 'nobody.handles.this': consumer 'billing' has no handler for it",
    ]
    assert results == [IngestResult(inserted=10, duplicates=0, failed=2)]
    o = outbox_table.c
    with pg_engine.connect() as conn:
        by_status = {
            r.status: r.n
            for r in conn.execute(select(o.status, func.count().label("n")).group_by(o.status))
        }
        sent_at = set(conn.execute(select(o.sent_at).where(o.status == states.SENT)).scalars())
        s = inbox_sequences_table.c
        counters = {r.sequence_key: r.last for r in conn.execute(select(s.sequence_key, s.last))}
    assert by_status == {states.SENT: 10, states.PENDING: 2}  # the other queue, the later one
    assert sent_at == {moment}
    assert counters == {"s-1": 0, "s-2": 0}


def test_a_message_already_received_is_counted_as_a_duplicate(pg_engine: Engine) -> None:
    consumer = _consumer()
    with pg_engine.begin() as conn:
        first = outbox.store(conn, "jobs", "job", {"n": 1})
        outbox.store(conn, "jobs", "job", {"n": 2})
    # Received once already (by a broker, say) before the take
    row = next(r for r in _due_rows(pg_engine, consumer) if r.event_id == first)
    InboxIngest(consumer, pg_engine)([envelope_from_row(row._mapping)])
    before = _inbox(pg_engine)[first]
    ingest, results = _recording(pg_engine, consumer)

    assert _source(pg_engine, consumer).run_once(ingest, 100, 0.0) == 2

    after = _inbox(pg_engine)
    assert after[first]["duplicates"] == 1
    assert {c: after[first][c] for c in WRITTEN} == {c: before[c] for c in WRITTEN}
    assert results == [IngestResult(inserted=1, duplicates=1, failed=0)]


def test_the_most_urgent_come_first_up_to_the_limit_and_locked_rows_are_skipped(
    pg_engine: Engine,
) -> None:
    consumer = _consumer()
    with pg_engine.begin() as conn:
        ids = [outbox.store(conn, "jobs", "job", {"p": p}, priority=p) for p in (3, 1, 2, 1)]
    held = ids[1]  # the first priority-1 row, locked by another transaction
    with pg_engine.connect() as other:
        o = outbox_table.c
        with other.begin():
            other.execute(select(o.id).where(o.event_id == held).with_for_update())
            ingest, _ = _recording(pg_engine, consumer)
            assert _source(pg_engine, consumer).run_once(ingest, 2, 0.0) == 2
            assert set(_inbox(pg_engine)) == {ids[3], ids[2]}  # priority 1 (not held), then 2
        assert _source(pg_engine, consumer).run_once(ingest, 2, 0.0) == 2
    assert set(_inbox(pg_engine)) == set(ids)


def test_nothing_due_takes_nothing_and_counts_nothing(pg_engine: Engine) -> None:
    consumer = _consumer()
    with pg_engine.begin() as conn:
        outbox.store(conn, "other", "job", {})
    ingest, results = _recording(pg_engine, consumer)
    assert _source(pg_engine, consumer).run_once(ingest, 100, 0.0) == 0
    assert results == []
    assert _inbox(pg_engine) == {}


def test_workers_are_woken_when_rows_were_inserted_and_not_for_duplicates_only(
    pg_engine: Engine,
) -> None:
    consumer = _consumer()
    url = pg_engine.url.set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as listener:
        listener.execute(
            psycopg.sql.SQL("LISTEN {}").format(
                psycopg.sql.Identifier(consumer.config.notify_channel)
            )
        )
        with pg_engine.begin() as conn:
            outbox.store(conn, "jobs", "job", {"n": 1}, event_id=EVENT)
        assert _notifications(listener) == ["jobs"]  # store()'s, for the relay
        ingest, _ = _recording(pg_engine, consumer)
        assert _source(pg_engine, consumer).run_once(ingest, 100, 0.0) == 1
        assert _notifications(listener) == [wake_payload(consumer)]

        # The same row pending again (an operator's republish, say) reaches the take as a
        # duplicate only: no wake-up.
        with pg_engine.begin() as conn:
            conn.execute(
                outbox_table.update()
                .where(outbox_table.c.event_id == EVENT)
                .values(status=states.PENDING)
            )
        assert _source(pg_engine, consumer).run_once(ingest, 100, 0.0) == 1
        assert _notifications(listener) == []


EVENT = "6b0f3c1e-8d57-4d8e-9a55-3f2c1d0e9a11"


def _notifications(listener: psycopg.Connection[Any]) -> list[str]:
    """What arrived; the take's NOTIFY was delivered at its commit, before it returned."""
    return [note.payload for note in listener.notifies(timeout=0.5)]
