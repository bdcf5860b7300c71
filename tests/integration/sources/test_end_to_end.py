"""store() -> relay -> broker -> broker source -> inbox -> handler, for RabbitMQ and Kafka.

PostgreSQL; the relay runs in this process until the outbox is drained, then two worker OS
processes (``outbox worker --source <broker> --stop-when-idle``) take the messages from the
broker and exit when it is drained. Asserted
from what the database recorded: one effect per message, S1's order inside the group, no two
runs of the group at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from sqlalchemy import Engine, select

from outbox import Message, states, store_many
from outbox.config import DEFAULT_CONFIG
from outbox.schema import schema_for
from relay.publishers import publisher_from_url
from relay.relay import Relay, RelaySettings
from tests.integration.relay.publishers_fixtures import unique
from tests.support import services
from tests.support.kafka import KafkaBroker
from tests.support.workers import Bed, completed_order, overlaps, wait_all

S1 = [("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 2), ("g", 1)]
S1_ORDER = ["a", "b", "d", "e", "g", "c", "f"]
PLAIN = 40


@pytest.fixture
def bed(dsn: str, engine: Engine, tmp_path: Path) -> Iterator[Bed]:
    testbed = Bed.create(dsn, engine, tmp_path)
    yield testbed
    testbed.dispose()


@pytest.fixture(params=["rabbitmq", "kafka"])
def broker_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "kafka":
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        yield broker.url
        return
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")
    yield services.RABBITMQ_URL


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_store_relay_broker_source_inbox_handler(bed: Bed, broker_url: str) -> None:
    queue, consumer = unique("e2e-"), unique("consumer-")
    group = "transcribe/rec-1"
    # Given S1's group and some ungrouped jobs, committed in the outbox
    messages = [
        Message(
            queue=queue,
            type="job",
            payload={"mark": m, "sleep": 0.03},
            priority=p,
            serial_group=group,
        )
        for m, p in S1
    ] + [
        Message(queue=queue, type="job", payload={"mark": f"plain-{i}"}, priority=1 + i % 3)
        for i in range(PLAIN)
    ]
    with bed.engine.begin() as conn:
        store_many(conn, messages)

    # When the relay drains the outbox into the broker ...
    relay = Relay(
        bed.engine,
        publisher_from_url(broker_url, confirm_timeout=10),
        RelaySettings(queues=(queue,), stop_when_idle=True, poll_interval=0.05),
    )
    stats = relay.run()
    assert stats.sent == len(messages)
    # ... and two workers consume it from the broker, stopping when idle
    workers = [
        bed.spawn(
            stop_when_idle=True,
            time_limit=120,
            extra=["--source", broker_url],
            queues=[queue],
            consumer=consumer,
        )
        for _ in range(2)
    ]
    try:
        codes = wait_all(workers, 150)
    finally:
        _cleanup(broker_url, queue)

    # Then every message had exactly one effect, and the group ran serially in S1's order
    assert codes == [0, 0]
    effects = [e.mark for e in bed.effects()]
    assert sorted(effects) == sorted([m for m, _ in S1] + [f"plain-{i}" for i in range(PLAIN)])
    events = bed.events()
    assert overlaps(events, group) == []
    assert completed_order(events, group) == S1_ORDER
    tables = schema_for(DEFAULT_CONFIG)
    with bed.engine.connect() as conn:
        statuses = (
            conn.execute(select(tables.outbox.c.status).where(tables.outbox.c.queue == queue))
            .scalars()
            .all()
        )
        inbox_states = (
            conn.execute(select(tables.inbox.c.state).where(tables.inbox.c.consumer == consumer))
            .scalars()
            .all()
        )
    assert set(statuses) == {states.SENT}
    assert len(inbox_states) == len(messages) and set(inbox_states) == {states.DONE}


def _cleanup(broker_url: str, queue: str) -> None:
    if not broker_url.startswith("amqp"):
        return  # topics on the session's in-memory broker go with it
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker_url))) as conn:
        channel = conn.channel()
        for priority in range(DEFAULT_CONFIG.min_priority, DEFAULT_CONFIG.max_priority + 1):
            channel.queue_delete(f"{queue}_{priority}")
