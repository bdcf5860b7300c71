"""The message contract travels without a broker: ``store()`` -> outbox row -> the database
source's take -> the envelopes handed to the inbox ingest (every database)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Engine

import outbox
from inbox import Consumer
from inbox.ingest import InboxIngest, IngestResult
from inbox.sources.database import DatabaseSource
from outbox.clock import utcnow
from outbox.transport import Rejected
from outbox.wire import Envelope


class RecordingIngest(InboxIngest):
    """The real ingest, also keeping what the source handed it."""

    def __init__(self, consumer: Consumer, engine: Engine) -> None:
        super().__init__(consumer, engine)
        self.received: list[Envelope | Rejected] = []

    def within(self, conn: Connection, messages: Sequence[Envelope | Rejected]) -> IngestResult:
        self.received.extend(messages)
        return super().within(conn, messages)


def test_database_source_hands_the_contract_fields_to_the_ingest(engine: Engine) -> None:
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
    ingest = RecordingIngest(consumer, engine)
    source = DatabaseSource(engine, ["jobs"], clock=utcnow)
    assert source.run_once(ingest, 100, 0.0) == 5

    # Then each envelope carries what was stored
    envelopes = {e.event_id: e for e in ingest.received if isinstance(e, Envelope)}
    assert len(envelopes) == 5
    fields = {
        event_id: (e.effect_key, e.sequence_key, e.sequence, e.schema_version)
        for event_id, e in envelopes.items()
    }
    assert [fields[e] for e in numbered] == [
        (f"order-1:step-{i}", "order-1", i + 1, "v2") for i in range(3)
    ]
    assert fields[given] == (None, "order-2", 40, None)
    assert fields[plain] == (None, None, None, None)
