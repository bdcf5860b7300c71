"""The message contract travels without a broker: ``store()`` -> outbox row -> the database
source's take -> the inbox rows and the sequence keys' counters (every database; PostgreSQL
takes in one statement, the others through ``InboxIngest``)."""

from __future__ import annotations

from sqlalchemy import Engine, select

import outbox
from inbox import Consumer
from inbox.ingest import InboxIngest
from inbox.sources.database import DatabaseSource
from outbox.clock import utcnow
from outbox.schema import inbox_sequences_table, inbox_table


def test_database_source_takes_the_contract_fields_into_the_inbox(engine: Engine) -> None:
    # Given keyed messages (numbered by store() and given) and one without the contract
    with engine.begin() as conn:
        numbered = outbox.store_many(
            conn,
            [
                outbox.Message(
                    "jobs",
                    "job",
                    {"i": i},
                    effect_key=f"order-1:step-{i}",
                    sequence_key="order-1",
                    schema_version="v2",
                )
                for i in range(3)
            ],
        )
        given = outbox.store(conn, "jobs", "job", {}, sequence_key="order-2", sequence=40)
        plain = outbox.store(conn, "jobs", "job", {})

    # When the database source takes them
    consumer = Consumer("c1", queues=["jobs"])
    source = DatabaseSource(engine, ["jobs"], clock=utcnow)
    assert source.run_once(InboxIngest(consumer, engine), 100, 0.0) == 5

    # Then each inbox row carries what was stored, and each sequence key has its counter
    i, s = inbox_table.c, inbox_sequences_table.c
    with engine.connect() as conn:
        rows = conn.execute(
            select(i.event_id, i.effect_key, i.sequence_key, i.sequence, i.schema_version)
        ).all()
        counters = {r.sequence_key: r.last for r in conn.execute(select(s.sequence_key, s.last))}
    fields = {
        r.event_id: (r.effect_key, r.sequence_key, r.sequence, r.schema_version) for r in rows
    }
    assert len(fields) == 5
    assert [fields[e] for e in numbered] == [
        (f"order-1:step-{i}", "order-1", i + 1, "v2") for i in range(3)
    ]
    assert fields[given] == (None, "order-2", 40, None)
    assert fields[plain] == (None, None, None, None)
    assert counters == {"order-1": 0, "order-2": 0}
