"""Bad input, relay side: rows the broker refuses (too large, a destination it will not take)
are row failures with the reason, after attempts and backoff, and never hold up other rows;
a read-only database loses nothing. PostgreSQL (the relay's code is the same elsewhere)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from sqlalchemy import Engine, insert, select, text
from sqlalchemy.exc import DBAPIError

import outbox
from outbox import states
from outbox.backoff import Backoff
from outbox.schema import outbox_table
from outbox.wire import from_wire
from relay.publishers.kafka import KafkaPublisher
from relay.publishers.rabbitmq import RabbitMQPublisher
from relay.relay import Relay, RelaySettings
from tests.integration.relay.helpers import RABBIT, rabbit_channel, read_queue, unique_queue
from tests.support.kafka import KafkaBroker

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
BIG = outbox.OutboxConfig(max_payload_bytes=4 * 1024 * 1024)


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC) + timedelta(seconds=1)

    def __call__(self) -> datetime:
        return self.now


def by_mark(engine: Engine) -> dict[str, dict[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(select(outbox_table).order_by(outbox_table.c.id)).mappings().all()
    return {
        (r["payload"]["mark"] if isinstance(r["payload"], dict) else "big"): dict(r) for r in rows
    }


def _store(engine: Engine, queue: str, marks: list[str], big: int = 0) -> None:
    with engine.begin() as conn:
        for mark in marks:
            payload: object = {"mark": mark}
            if mark == "big":
                payload = "x" * big
            outbox.store(conn, queue, "t", payload, key=f"k-{mark}", config=BIG)


def _drive(relay: Relay, clock: Clock, rounds: int) -> None:
    """Run batches, letting every backoff run out between them."""
    for _ in range(rounds):
        relay.run_once()
        clock.now += timedelta(seconds=10)


def test_kafka_too_large_row_fails_with_the_reason_and_others_are_sent(
    engine: Engine, kafka_broker: KafkaBroker
) -> None:
    # Given a row over the producer's message.max.bytes (1 MB) between two small ones
    queue = unique_queue("bi")
    _store(engine, queue, ["a", "big", "b"], big=1_100_000)
    clock = Clock()
    publisher = KafkaPublisher(kafka_broker.bootstrap, partitions=1, confirm_timeout=10)
    relay = Relay(
        engine, publisher, RelaySettings(max_attempts=3, backoff=Backoff(1, 5)), clock=clock
    )
    try:
        # When the relay runs until the big row has used its attempts
        _drive(relay, clock, 4)
    finally:
        publisher.close()
    rows = by_mark(engine)
    # Then the small rows went out at once, the big one is failed with the broker's reason
    assert rows["a"]["status"] == rows["b"]["status"] == states.SENT
    assert rows["big"]["status"] == states.FAILED
    assert rows["big"]["attempts"] == 3
    assert "MSG_SIZE_TOO_LARGE" in str(rows["big"]["last_error"])


def test_rabbitmq_row_over_the_queue_byte_limit_fails_alone(
    engine: Engine, rabbit_names: list[str]
) -> None:
    # Given a queue that takes at most 2000 bytes (reject-publish: a nack), and a big row
    queue = unique_queue("bi")
    rabbit_names.append(f"{queue}_1")
    _store(engine, queue, ["a", "big", "b"], big=5000)
    clock = Clock()
    publisher = RabbitMQPublisher(
        RABBIT, queue_arguments={"x-max-length-bytes": 2000, "x-overflow": "reject-publish"}
    )
    relay = Relay(
        engine, publisher, RelaySettings(max_attempts=2, backoff=Backoff(1, 5)), clock=clock
    )
    try:
        _drive(relay, clock, 3)
    finally:
        publisher.close()
    rows = by_mark(engine)
    assert rows["a"]["status"] == rows["b"]["status"] == states.SENT
    assert (rows["big"]["status"], rows["big"]["attempts"]) == (states.FAILED, 2)
    assert "nacked" in str(rows["big"]["last_error"])
    assert sorted(_take_all(f"{queue}_1")) == ["a", "b"]


def _take_all(name: str) -> list[str]:
    """Marks of the messages in ``name`` (a queue declared with arguments: no redeclare)."""
    marks: list[str] = []
    with rabbit_channel() as channel:
        while True:
            method, properties, body = channel.basic_get(name, auto_ack=True)
            if method is None:
                return marks
            marks.append(from_wire(properties.headers, body).payload()["mark"])


@pytest.mark.parametrize(
    "bad_queue",
    ["amq.h4b", "q" * 255],
    ids=["reserved amq. prefix", "routing name over 255 bytes"],
)
def test_a_destination_rabbitmq_refuses_is_a_row_failure_not_an_outage(
    engine: Engine, rabbit_names: list[str], bad_queue: str
) -> None:
    """RabbitMQ refuses these queues (403 / shortstr > 255). store() should refuse them
    (tests/integration/security/test_names.py); rows already in the table (stored before
    that check, or by another writer) must cost an attempt with the reason, never stall every
    other row as a broker outage would (the relay backs off as a whole, counts no attempt)."""
    good = unique_queue("bi")
    rabbit_names.append(f"{good}_1")
    now = datetime.now(UTC)
    with engine.begin() as conn:
        # written as a row, past store()'s validation
        conn.execute(
            insert(outbox_table).values(
                event_id=uuid4(),
                queue=bad_queue,
                priority=1,
                type="t",
                payload='{"mark": "bad"}',
                headers="{}",
                occurred_at=now,
                available_at=now,
            )
        )
        outbox.store(conn, good, "t", {"mark": "good"})
    clock = Clock()
    publisher = RabbitMQPublisher(RABBIT, confirm_timeout=5)
    relay = Relay(engine, publisher, RelaySettings(max_attempts=1), clock=clock)
    try:
        result = relay.run_once()  # must not raise BrokerUnavailable
    finally:
        publisher.close()
    rows = by_mark(engine)
    assert rows["good"]["status"] == states.SENT
    assert rows["bad"]["status"] == states.FAILED
    assert rows["bad"]["last_error"]
    assert (result.sent, result.failed) == (1, 1)


def test_read_only_database_loses_nothing(engine: Engine, rabbit_names: list[str]) -> None:
    queue = unique_queue("bi")
    rabbit_names.append(f"{queue}_1")
    _store(engine, queue, ["a", "b"])
    database = engine.url.database
    admin = engine.execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on'))
    engine.dispose()  # new sessions pick the setting up
    publisher = RabbitMQPublisher(RABBIT)
    relay = Relay(engine, publisher, RelaySettings())
    try:
        # When the database is read-only: store() fails with the database's error, and the
        # relay's batch fails before anything is published (FOR UPDATE is refused)
        with pytest.raises(DBAPIError, match="read-only"), engine.begin() as conn:
            outbox.store(conn, queue, "t", {"mark": "c"})
        with pytest.raises(DBAPIError, match="read-only"):
            relay.run_once()
        assert read_queue(f"{queue}_1", 1, timeout=1) == []
        # Then, writable again, everything stored before is published once
        with admin.connect() as conn:
            conn.execute(text("SET default_transaction_read_only = off"))  # this session
            conn.execute(text(f'ALTER DATABASE "{database}" RESET default_transaction_read_only'))
        engine.dispose()
        relay.engine.dispose()
        assert relay.run_once().sent == 2
    finally:
        publisher.close()
    rows = by_mark(engine)
    assert set(rows) == {"a", "b"}
    assert {r["status"] for r in rows.values()} == {states.SENT}
    got = read_queue(f"{queue}_1", 2, timeout=10)
    assert sorted(d.envelope.payload()["mark"] for d in got) == ["a", "b"]
