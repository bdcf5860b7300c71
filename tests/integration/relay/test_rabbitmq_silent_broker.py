"""A RabbitMQ that stops answering (its bytes held back by a proxy, what the relay sends still
taken) ends every wait of the publisher within its confirm timeout: the confirms of a batch,
and the declare of a destination it has not declared on this connection yet.

The declare case is the race tests/faults/test_confirm_stall.py met: a relay that reconnected
after a stall and then had nothing to publish met the next stall on its first declare, which
waited without a time limit (holding its batch's row locks)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pika
import pytest

from outbox.transport import BrokerUnavailable
from outbox.wire import H_EVENT_ID, Envelope
from relay.publishers.rabbitmq import RabbitMQPublisher
from tests.integration.relay.publishers_fixtures import (
    StallingProxy,
    envelope,
    outgoing,
    read_rabbitmq,
    unique,
)
from tests.support import services

RABBITMQ = services.RABBITMQ_URL
CONFIRM_TIMEOUT = 1.0
# Far above the confirm timeout: a wait that had no limit is still waiting at this deadline.
DEADLINE = 30.0


@pytest.fixture
def proxy() -> Iterator[StallingProxy]:
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")
    proxy = StallingProxy(("127.0.0.1", 5672)).start()
    try:
        yield proxy
    finally:
        proxy.cut()  # also ends a publish that never gave up: its socket is closed


def _publisher(proxy: StallingProxy, **options: bool) -> RabbitMQPublisher:
    url = RABBITMQ.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}")
    return RabbitMQPublisher(url, confirm_timeout=CONFIRM_TIMEOUT, **options)


def _publish_in_thread(publisher: RabbitMQPublisher, batch: list[Envelope]) -> list[BaseException]:
    """Publish ``batch`` in a thread; what it raised (nothing: empty) once it ended."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            publisher.publish(outgoing(batch))
        except BaseException as exc:  # the test reads it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    assert not thread.is_alive(), f"the publish still waits after {DEADLINE}s"
    return outcome


def _delete(name: str, *, exchange: bool = False) -> None:
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(RABBITMQ))) as conn:
        channel = conn.channel()
        if exchange:
            channel.exchange_delete(name)
        else:
            channel.queue_delete(name)


@pytest.mark.parametrize("fanout", [False, True], ids=["queue", "fanout-exchange"])
def test_a_first_declare_met_by_a_silent_broker_gives_up(
    proxy: StallingProxy, fanout: bool
) -> None:
    # Given a publisher connected (channel open, confirm mode on), nothing declared yet
    queue = unique("silent-declare")
    publisher = _publisher(proxy, fanout=fanout)
    publisher.connect()
    try:
        # When the broker stops answering and a batch needs a new destination
        proxy.stall()
        outcome = _publish_in_thread(publisher, [envelope(queue)])
    finally:
        proxy.resume()
        publisher.close()
        _delete(f"{queue}_1", exchange=fanout)

    # Then the publish gave up on the declare as an outage
    assert len(outcome) == 1 and isinstance(outcome[0], BrokerUnavailable), outcome
    assert "no answer from" in str(outcome[0]) and "declaring" in str(outcome[0])


def test_held_back_confirms_give_up_and_the_next_connection_publishes(
    proxy: StallingProxy,
) -> None:
    # Given a publisher that already declared its destination
    queue = unique("silent-confirms")
    publisher = _publisher(proxy)
    first, stalled, after = envelope(queue), envelope(queue), envelope(queue)
    try:
        assert publisher.publish(outgoing([first])) == {first.outbox_id: None}

        # When the broker's confirms are held back
        proxy.stall()
        outcome = _publish_in_thread(publisher, [stalled])
        proxy.resume()

        # Then the batch gave up on its confirms, and a new connection publishes again
        assert len(outcome) == 1 and isinstance(outcome[0], BrokerUnavailable), outcome
        assert "no answer from" in str(outcome[0]) and "confirms" in str(outcome[0])
        assert publisher.publish(outgoing([after])) == {after.outbox_id: None}
        # RabbitMQ took the stalled copy too (the relay would publish it again): none is lost
        ids = {h[H_EVENT_ID] for h, _ in read_rabbitmq(RABBITMQ, f"{queue}_1", 3)}
        assert ids == {str(e.event_id) for e in (first, stalled, after)}
    finally:
        publisher.close()
        _delete(f"{queue}_1")
