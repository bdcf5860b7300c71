"""outbox.testing with the real relay and the real worker, on SQLite and PostgreSQL.

store() -> ``Relay`` -> ``InMemoryPublisher`` -> ``InMemorySource`` -> ``Worker`` -> handler:
asserted from what the database recorded (outbox rows sent or failed, inbox rows done, one
effect per message, S1's order inside the group), as a user's handler test would.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, insert, select
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage
from inbox.worker import Worker, WorkerOptions
from outbox import Message, inbox_table, outbox_table, states, store, store_many
from outbox.testing import InMemoryPublisher, InMemorySource
from outbox.transport import BrokerUnavailable
from relay.relay import Relay, RelaySettings

pytestmark = pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)

S1 = [("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 2), ("g", 1)]
S1_ORDER = ["a", "b", "d", "e", "g", "c", "f"]
PLAIN = 10

effects_metadata = MetaData()
effects = Table(
    "test_in_memory_effects",
    effects_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("mark", String(50), nullable=False),
)


def make_consumer() -> Consumer:
    consumer = Consumer("billing", queues=["jobs"])

    @consumer.handler("job")
    def job(session: Session, message: InboxMessage) -> None:
        session.execute(insert(effects).values(mark=message.payload["mark"]))

    return consumer


def relay(engine: Engine, publisher: InMemoryPublisher, **settings: Any) -> Relay:
    return Relay(engine, publisher, RelaySettings(poll_interval=0.05, **settings))


def work(engine: Engine, consumer: Consumer, source: InMemorySource) -> Worker:
    worker = Worker(
        consumer,
        engine,
        source,
        WorkerOptions(poll_interval=0.05, stop_when_idle=True, time_limit=60),
        broker=True,
    )
    assert worker.run(install_signals=False) == 0
    return worker


def marks(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(effects.c.mark).order_by(effects.c.id)).scalars())


def outbox_statuses(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(select(outbox_table.c.payload, outbox_table.c.status)).all()
    return {row.payload["mark"]: row.status for row in rows}


def test_relay_publishes_into_memory_and_the_worker_runs_each_message_once(
    engine: Engine,
) -> None:
    effects_metadata.create_all(engine)
    consumer = make_consumer()
    grouped = [
        Message(queue="jobs", type="job", payload={"mark": m}, priority=p, serial_group="rec-1")
        for m, p in S1
    ]
    plain = [
        Message(queue="jobs", type="job", payload={"mark": f"plain-{i}"}, priority=1 + i % 3)
        for i in range(PLAIN)
    ]
    with engine.begin() as conn:
        store_many(conn, grouped + plain)
    publisher = InMemoryPublisher()

    # When a real relay drains the outbox into the in-memory publisher
    stats = relay(engine, publisher, stop_when_idle=True).run()

    # Then every row was published once, to <queue>_<priority>, and is marked sent
    assert stats.sent == len(grouped) + len(plain)
    assert [e.payload()["mark"] for e in publisher.messages("jobs_2") if e.serial_group] == [
        "c",
        "f",
    ]
    assert sorted(publisher.destinations()) == ["jobs_1", "jobs_2", "jobs_3"]
    assert set(outbox_statuses(engine).values()) == {states.SENT}

    # When a real worker receives them through the in-memory source
    source = InMemorySource.from_publisher(publisher, queues=consumer.queues)
    worker = work(engine, consumer, source)

    # Then each message had one effect, the group ran in S1's order, every inbox row is done
    done = marks(engine)
    assert sorted(done) == sorted([m for m, _ in S1] + [f"plain-{i}" for i in range(PLAIN)])
    assert [m for m in done if not m.startswith("plain-")] == S1_ORDER
    assert worker.duplicates == 0 and source.pending == []
    with engine.connect() as conn:
        inbox_states = conn.execute(select(inbox_table.c.state)).scalars().all()
    assert len(inbox_states) == len(done) and set(inbox_states) == {states.DONE}

    # And a broker's redelivery of all of it is absorbed: counted, no second effect
    again = work(engine, consumer, InMemorySource(publisher.envelopes))
    assert again.duplicates == len(done)
    assert sorted(marks(engine)) == sorted(done)


def test_refused_rows_fail_at_max_attempts_and_the_others_are_sent(engine: Engine) -> None:
    with engine.begin() as conn:
        kept = store(conn, "jobs", "job", {"mark": "kept"})
        bad = store(conn, "jobs", "job", {"mark": "bad"})
    publisher = InMemoryPublisher()
    publisher.refuse(bad, reason="message too large")

    result = relay(engine, publisher, max_attempts=1).run_once()

    assert (result.sent, result.refused, result.failed) == (1, 1, 1)
    assert [e.event_id for e in publisher.envelopes] == [kept]
    assert [(e.event_id, why) for e, why in publisher.refused] == [(bad, "message too large")]
    assert outbox_statuses(engine) == {"kept": states.SENT, "bad": states.FAILED}
    with engine.connect() as conn:
        error = conn.execute(
            select(outbox_table.c.last_error).where(outbox_table.c.event_id == bad)
        ).scalar_one()
    assert "message too large" in error


def test_an_unavailable_broker_leaves_rows_pending_without_an_attempt(engine: Engine) -> None:
    with engine.begin() as conn:
        store(conn, "jobs", "job", {"mark": "a"})
    publisher = InMemoryPublisher()
    publisher.unavailable = True
    the_relay = relay(engine, publisher)
    with pytest.raises(BrokerUnavailable):
        the_relay.run_once()
    publisher.unavailable = False
    publisher.fail_next()
    with pytest.raises(BrokerUnavailable):
        the_relay.run_once()  # connected, but the batch's outcome is unknown: rolled back
    with engine.connect() as conn:
        row = conn.execute(select(outbox_table.c.status, outbox_table.c.attempts)).one()
    assert (row.status, row.attempts) == (states.PENDING, 0)
    assert publisher.envelopes == []

    assert the_relay.run_once().sent == 1
    assert publisher.payloads("jobs_1") == [{"mark": "a"}]
    assert outbox_statuses(engine) == {"a": states.SENT}
