"""RabbitMQ unreachable mid-stream (its port cut by a proxy we own): nothing lost, no attempt
counted, the outage counted as errors, publishing resumes by itself."""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

import pytest
from sqlalchemy import Engine, func, select

from outbox import states
from outbox.schema import outbox_table
from outbox.store import Message
from relay.publishers.rabbitmq import RabbitMQPublisher
from relay.relay import Relay, RelaySettings
from tests.integration.relay.helpers import (
    KIB_PAYLOAD,
    RABBIT,
    read_queue,
    status_counts,
    store_rows,
    unique_queue,
    wait_for,
)
from tests.integration.relay.publishers_fixtures import TcpProxy

pytestmark = pytest.mark.db
TOTAL = 3000


def test_broker_outage_loses_nothing_and_counts_no_attempt(
    engine: Engine, rabbit_names: list[str]
) -> None:
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")
    store_rows(engine, [Message(queue, "t", {"i": i, "pad": KIB_PAYLOAD}) for i in range(TOTAL)])
    with engine.connect() as conn:
        stored = set(conn.execute(select(outbox_table.c.event_id)).scalars())

    target = urlsplit(RABBIT)
    proxy = TcpProxy((target.hostname or "127.0.0.1", target.port or 5672)).start()
    url = RABBIT.replace(f":{target.port}/", f":{proxy.port}/")
    relay = Relay(
        engine,
        RabbitMQPublisher(url, confirm_timeout=5),
        RelaySettings(batch_size=20, poll_interval=0.05),
    )
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        # When the port is cut while the relay is publishing
        wait_for(lambda: status_counts(engine).get(states.SENT, 0) >= 300, 60, "300 sent")
        proxy.cut()
        wait_for(lambda: relay.stats.broker_errors >= 2, 30, "two failed reconnects")
        during = status_counts(engine).get(states.SENT, 0)
        assert during < TOTAL
        # ... nothing gets marked sent while the broker is unreachable
        wait_for(lambda: relay.stats.broker_errors >= 3, 30, "a third failed reconnect")
        assert status_counts(engine).get(states.SENT, 0) == during
        proxy.restore()
        # Then it reconnects by itself and drains everything
        wait_for(lambda: status_counts(engine) == {states.SENT: TOTAL}, 120, "all sent")
    finally:
        relay.stop()
        thread.join(timeout=30)
        proxy.cut()
    assert not thread.is_alive()
    with engine.connect() as conn:
        attempts = conn.execute(select(func.max(outbox_table.c.attempts))).scalar_one()
    assert attempts == 0  # an outage is not the rows' fault
    errors = relay.metrics.registry.get_sample_value(
        "outbox_publish_errors_total", {"queue": "", "priority": "0"}
    )
    assert errors is not None and errors >= 3
    delivered = read_queue(f"{queue}_1", TOTAL, timeout=60)
    received = [d.envelope.event_id for d in delivered]
    # Zero lost; a batch cut after the broker took it but before the commit comes twice.
    assert set(received) == stored
    print(
        f"outage: {len(received) - TOTAL} duplicate deliveries, {relay.stats.broker_errors} errors"
    )
