"""PostgreSQL ingests a broker's batch as one JSON array parameter
(``inbox.sql.ingest.ingest_recordset``): the rows it writes must be exactly the rows
``InboxIngest._row`` builds, whatever the message holds (unicode, empty and missing
documents, a rejected message, the contract's fields, no key or group)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

from sqlalchemy import Engine, select

from inbox import Consumer
from inbox.ingest import InboxIngest
from inbox.sql.ingest import INGESTED_COLUMNS
from outbox.schema import inbox_table
from outbox.transport import Rejected
from outbox.wire import H_EVENT_ID, H_QUEUE, Envelope

NOW = datetime(2026, 12, 4, 12, 0, 0, 123456, tzinfo=UTC)


def _messages() -> list[Envelope | Rejected]:
    def envelope(**fields: Any) -> Envelope:
        base: dict[str, Any] = {
            "event_id": uuid4(),
            "type": "job",
            "queue": "jobs",
            "priority": 1,
            "outbox_id": 7,
            "occurred_at": NOW - timedelta(seconds=3),
            "body": "{}",
        }
        return Envelope(**{**base, **fields})

    return [
        envelope(),
        envelope(body='{"text":"grüße, 東京 \\u2028","n":[1,null,{"x":true}]}', priority=9),
        envelope(serial_group="g-1", key="k-1", headers={"trace": "t-1", "empty": ""}),
        envelope(effect_key="e-1", sequence_key="s-1", sequence=3, schema_version="v2"),
        envelope(type="nobody.handles.this", outbox_id=2**40),
        Rejected("not JSON", {H_EVENT_ID: str(uuid4()), H_QUEUE: "jobs"}, b"\xff not json"),
        Rejected("no headers at all", {}, b"", origin="rabbitmq"),
    ]


def test_each_row_is_the_row_the_ingest_built(pg_engine: Engine) -> None:
    consumer = Consumer("billing", queues=["jobs"])
    consumer.handler("job")(lambda session, message: None)
    ingest = InboxIngest(consumer, pg_engine, clock=lambda: NOW)
    messages = _messages()
    expected = {}
    for message in messages:
        row = ingest._row(message, NOW)
        for name in ("payload", "headers"):
            row[name] = None if row[name] is None else json.loads(row[name])
        expected[row["event_id"]] = row

    with pg_engine.begin() as conn:
        result = ingest.within(conn, messages)

    with pg_engine.connect() as conn:
        found = {r["event_id"]: dict(r) for r in conn.execute(select(inbox_table)).mappings()}
    assert set(found) == set(expected)
    for event_id, row in expected.items():
        assert {c: found[event_id][c] for c in INGESTED_COLUMNS} == row
    assert (result.inserted, result.duplicates, result.failed) == (7, 0, 3)


def test_a_batch_received_twice_is_counted_as_duplicates(pg_engine: Engine) -> None:
    consumer = Consumer("billing", queues=["jobs"])
    consumer.handler("job")(lambda session, message: None)
    ingest = InboxIngest(consumer, pg_engine)
    messages = _messages()
    with pg_engine.begin() as conn:
        ingest.within(conn, messages[:3])
    with pg_engine.begin() as conn:
        again = ingest.within(conn, messages + messages[:1])
    assert (again.inserted, again.duplicates) == (4, 4)
    with pg_engine.connect() as conn:
        counts = sorted(conn.execute(select(inbox_table.c.duplicates)).scalars())
    assert counts == [0, 0, 0, 0, 1, 1, 2]
