"""The Kafka broker SIGKILLed mid-stream and restarted on the same port (tansu keeps nothing:
its topics and records are gone): the relay counts the outage as errors and no attempt,
recreates the topic and publishes what is still pending. Done with the broker process itself
(``kafka_broker_private.kill()`` / ``start()``), not a proxy."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
from sqlalchemy import Engine, func, select

from outbox import states
from outbox.schema import outbox_table
from outbox.store import Message
from relay.publishers.kafka import KafkaPublisher
from relay.relay import Relay, RelaySettings
from tests.integration.relay.helpers import (
    KIB_PAYLOAD,
    status_counts,
    store_rows,
    unique_queue,
    wait_for,
)
from tests.integration.relay.test_relay_key_order_kafka import read_topics
from tests.support.kafka import KafkaBroker

pytestmark = pytest.mark.db
BEFORE = 6000  # stored before the outage
DURING = 500  # stored while the broker is down


def sent_ids(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                select(outbox_table.c.event_id).where(outbox_table.c.status == states.SENT)
            ).scalars()
        )


def test_kafka_broker_killed_and_restarted_loses_nothing(
    engine: Engine, kafka_broker_private: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="relay")
    broker = kafka_broker_private
    queue = unique_queue("kout")
    total = BEFORE + DURING
    store_rows(engine, [Message(queue, "t", {"i": i, "pad": KIB_PAYLOAD}) for i in range(BEFORE)])
    relay = Relay(
        engine,
        KafkaPublisher(broker.bootstrap, confirm_timeout=3),
        RelaySettings(batch_size=20, poll_interval=0.05),
    )
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        # When the broker dies while the relay is publishing
        wait_for(lambda: status_counts(engine).get(states.SENT, 0) >= 300, 60, "300 sent")
        broker.kill()
        wait_for(lambda: relay.stats.broker_errors >= 2, 60, "two failed reconnects")
        before_restart = sent_ids(engine)
        assert len(before_restart) < BEFORE, "all sent before the kill: not mid-stream"
        store_rows(engine, [Message(queue, "t", {"late": i}) for i in range(DURING)])
        # ... nothing gets marked sent while the broker is down
        wait_for(lambda: relay.stats.broker_errors >= 3, 60, "a third failed reconnect")
        assert sent_ids(engine) == before_restart
        # Then the broker comes back empty, and the relay recreates the topic and drains
        broker.start()
        wait_for(lambda: status_counts(engine) == {states.SENT: total}, 120, "all sent")
    finally:
        relay.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()

    with engine.connect() as conn:
        stored = set(conn.execute(select(outbox_table.c.event_id)).scalars())
        attempts = conn.execute(select(func.max(outbox_table.c.attempts))).scalar_one()
    assert len(stored) == total
    assert attempts == 0  # no row was refused: an outage is not the rows' fault
    errors = relay.metrics.registry.get_sample_value(
        "outbox_publish_errors_total", {"queue": "", "priority": "0"}
    )
    assert errors is not None and errors >= 3
    outage_logs = [r for r in caplog.records if "broker unavailable" in r.getMessage()]
    assert len(outage_logs) >= 3, [r.getMessage() for r in caplog.records][:5]

    # Every row the database marked sent after the restart is on the restarted broker, and
    # nothing else is: the rows sent before the kill died with the old broker's memory.
    after_restart = stored - before_restart
    records = read_topics(broker.bootstrap, [f"{queue}_1"], after_restart, timeout=60)
    received = [r.envelope.event_id for r in records]
    assert set(received) == after_restart
    print(
        f"\nkafka outage: {len(before_restart)} sent before the kill, {len(after_restart)} "
        f"after the restart, {len(received) - len(after_restart)} duplicates, "
        f"{relay.stats.broker_errors} broker errors"
    )
