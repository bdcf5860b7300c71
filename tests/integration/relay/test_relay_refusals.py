"""Rows the real broker refuses: attempts, backoff, dead letter; and per-key hold-back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select

from outbox import states
from outbox.backoff import Backoff
from outbox.schema import outbox_table
from outbox.store import Message
from outbox.transport import Outgoing
from relay.publishers.rabbitmq import RabbitMQPublisher
from relay.relay import Relay, RelaySettings
from tests.integration.relay.helpers import (
    RABBIT,
    rabbit_channel,
    read_queue,
    store_rows,
    unique_queue,
)

pytestmark = pytest.mark.db


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC) + timedelta(seconds=1)

    def __call__(self) -> datetime:
        return self.now


def rows(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        result = conn.execute(select(outbox_table).order_by(outbox_table.c.id)).mappings()
        return [dict(r) for r in result]


def test_nacked_row_backs_off_then_fails_at_max_attempts(
    engine: Engine, rabbit_names: list[str]
) -> None:
    # Given a queue the broker refuses everything on (max length 0, reject-publish: a nack)
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")
    store_rows(engine, [Message(queue, "t", {"i": 1})])
    publisher = RabbitMQPublisher(
        RABBIT, queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    clock = Clock()
    relay = Relay(
        engine,
        publisher,
        RelaySettings(max_attempts=3, backoff=Backoff(1.0, 4.0)),
        clock=clock,
    )
    try:
        # When it is refused the first time
        assert relay.run_once().refused == 1
        [row] = rows(engine)
        # Then the attempt counts, the row waits at most base seconds, the reason is kept
        assert row["status"] == states.PENDING and row["attempts"] == 1
        assert clock.now <= row["available_at"] <= clock.now + timedelta(seconds=1)  # type: ignore[operator]
        assert "nacked" in str(row["last_error"])
        # ... and it is not due before its backoff ends
        clock.now = row["available_at"] - timedelta(milliseconds=1)  # type: ignore[operator]
        assert relay.run_once().fetched == 0

        clock.now = row["available_at"]  # type: ignore[assignment]
        assert relay.run_once().refused == 1
        [row] = rows(engine)
        assert row["status"] == states.PENDING and row["attempts"] == 2
        assert row["available_at"] <= clock.now + timedelta(seconds=2)  # type: ignore[operator]

        clock.now = row["available_at"]  # type: ignore[assignment]
        result = relay.run_once()
        [row] = rows(engine)
    finally:
        publisher.close()
    # Then at max_attempts it is dead-lettered with the reason, and never picked up again
    assert result.failed == 1
    assert row["status"] == states.FAILED and row["attempts"] == 3
    assert "nacked" in str(row["last_error"])
    clock.now += timedelta(days=1)
    assert relay.run_once().fetched == 0
    assert len(rows(engine)) == 1


def test_fanout_unroutable_is_refused_and_bound_is_delivered(
    engine: Engine, rabbit_names: list[str]
) -> None:
    lonely, bound = unique_queue(), unique_queue()
    consumer_queue = unique_queue("rl_consumer")
    rabbit_names += [f"{lonely}_1", f"{bound}_1", consumer_queue]
    with rabbit_channel() as ch:
        ch.exchange_declare(f"{bound}_1", exchange_type="fanout", durable=True)
        ch.queue_declare(consumer_queue, durable=True)
        ch.queue_bind(consumer_queue, f"{bound}_1")
    store_rows(engine, [Message(lonely, "t", {"i": 1}), Message(bound, "t", {"i": 2})])

    publisher = RabbitMQPublisher(RABBIT, fanout=True)
    relay = Relay(engine, publisher, RelaySettings(max_attempts=1))
    try:
        result = relay.run_once()
    finally:
        publisher.close()

    assert (result.sent, result.refused, result.failed) == (1, 1, 1)
    by_queue = {r["queue"]: r for r in rows(engine)}
    assert by_queue[lonely]["status"] == states.FAILED
    assert "NO_ROUTE" in str(by_queue[lonely]["last_error"])
    assert by_queue[bound]["status"] == states.SENT
    [delivered] = read_queue(consumer_queue, 1)
    assert delivered.envelope.payload() == {"i": 2}


class RefuseOnce:
    """The real RabbitMQ publisher, except that chosen rows are refused on their first try."""

    def __init__(self, inner: RabbitMQPublisher, refuse: set[int]) -> None:
        self.inner = inner
        self.refuse = set(refuse)

    def connect(self) -> None:
        self.inner.connect()

    def close(self) -> None:
        self.inner.close()

    def idle(self) -> None:
        self.inner.idle()

    def publish(self, batch: Sequence[Outgoing]) -> Mapping[int, str | None]:
        refused = {o.row_id for o in batch if o.row_id in self.refuse}
        self.refuse -= refused
        verdicts = dict(self.inner.publish([o for o in batch if o.row_id not in refused]))
        verdicts.update({row_id: "refused by the test" for row_id in refused})
        return verdicts


def test_row_in_backoff_holds_back_its_key_only(engine: Engine, rabbit_names: list[str]) -> None:
    # Given k1: a, b; no key: c; k2: d, e — and a is refused once
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")
    store_rows(
        engine,
        [
            Message(queue, "t", {"m": "a"}, key="k1"),
            Message(queue, "t", {"m": "b"}, key="k1"),
            Message(queue, "t", {"m": "c"}),
            Message(queue, "t", {"m": "d"}, key="k2"),
            Message(queue, "t", {"m": "e"}, key="k2"),
        ],
    )
    ids = {r["payload"]["m"]: r["id"] for r in rows(engine)}  # type: ignore[index]
    clock = Clock()
    publisher = RefuseOnce(RabbitMQPublisher(RABBIT), {int(ids["a"])})  # type: ignore[call-overload]
    relay = Relay(engine, publisher, RelaySettings(backoff=Backoff(5.0, 5.0)), clock=clock)
    try:
        # When the relay runs until nothing is due
        while relay.run_once().fetched:
            pass
        state = {r["payload"]["m"]: r["status"] for r in rows(engine)}  # type: ignore[index]
        # Then b waits behind a; c, d, e went out
        assert state == {"a": "pending", "b": "pending", "c": "sent", "d": "sent", "e": "sent"}
        # ... and once a's backoff is over, a then b
        clock.now += timedelta(seconds=5)
        while relay.run_once().fetched:
            pass
    finally:
        publisher.close()
    assert {r["status"] for r in rows(engine)} == {states.SENT}
    order = [d.envelope.payload()["m"] for d in read_queue(f"{queue}_1", 5)]
    assert order.index("a") < order.index("b")
    assert order.index("d") < order.index("e")
    assert order.index("c") < order.index("a")  # not held back by k1
