"""The relay against the real RabbitMQ on PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import Engine, select

from outbox import states
from outbox.schema import outbox_table
from outbox.store import Message
from relay.publishers.rabbitmq import RabbitMQPublisher
from relay.relay import Relay, RelaySettings
from tests.integration.relay.helpers import (
    RABBIT,
    read_queue,
    status_counts,
    store_rows,
    unique_queue,
)

pytestmark = pytest.mark.db


def test_drains_outbox_into_priority_queues(engine: Engine, rabbit_names: list[str]) -> None:
    # Given 30 messages on two priorities, some keyed, one with application headers
    queue = unique_queue()
    rabbit_names += [f"{queue}_1", f"{queue}_2"]
    messages = [
        Message(
            queue,
            "thing.happened",
            {"n": i, "text": "žluťoučký"},
            priority=1 + i % 2,
            key=f"k{i % 3}" if i % 5 else None,
            headers={"trace": f"t{i}"},
        )
        for i in range(30)
    ]
    store_rows(engine, messages)

    # When one relay runs until idle
    relay = Relay(
        engine, RabbitMQPublisher(RABBIT), RelaySettings(batch_size=7, stop_when_idle=True)
    )
    stats = relay.run()

    # Then every row is sent and each priority queue holds its messages, in id order per key
    assert stats.sent == 30 and stats.exit_reason == "idle"
    assert status_counts(engine) == {states.SENT: 30}
    got1 = read_queue(f"{queue}_1", 15)
    got2 = read_queue(f"{queue}_2", 15)
    assert len(got1) == len(got2) == 15
    for delivered in got1 + got2:
        env = delivered.envelope
        assert env.payload()["text"] == "žluťoučký"
        assert env.headers == {"trace": f"t{env.payload()['n']}"}
        assert delivered.properties.delivery_mode == 2
        assert delivered.properties.content_type == "application/json"
        assert delivered.properties.message_id == str(env.event_id)
    with engine.connect() as conn:
        stored = {r.event_id: r for r in conn.execute(select(outbox_table)).all()}
    for delivered in got1 + got2:
        row = stored[delivered.envelope.event_id]
        assert delivered.envelope.outbox_id == row.id
        assert delivered.envelope.priority == row.priority
        assert delivered.envelope.key == row.key
        assert row.sent_at is not None and row.attempts == 0
    for got in (got1, got2):
        per_key: dict[str | None, list[int]] = {}
        for d in got:
            per_key.setdefault(d.envelope.key, []).append(d.envelope.outbox_id)
        for key, ids in per_key.items():
            if key is not None:
                assert ids == sorted(ids), key
    assert Counter(d.envelope.priority for d in got1) == {1: 15}


def test_queue_filter_leaves_other_queues_pending(engine: Engine, rabbit_names: list[str]) -> None:
    mine, other = unique_queue(), unique_queue()
    rabbit_names += [f"{mine}_1", f"{other}_1"]
    store_rows(engine, [Message(mine, "t", {"i": i}) for i in range(5)])
    store_rows(engine, [Message(other, "t", {"i": i}) for i in range(3)])

    settings = RelaySettings(queues=(mine,), stop_when_idle=True)
    stats = Relay(engine, RabbitMQPublisher(RABBIT), settings).run()

    assert stats.sent == 5
    assert status_counts(engine) == {states.SENT: 5, states.PENDING: 3}
    assert len(read_queue(f"{mine}_1", 5)) == 5
