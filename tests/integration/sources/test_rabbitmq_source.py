"""RabbitMQ-only behaviour of RabbitMQSource: fan-out consumer groups, queue arguments."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pika
import pytest

from inbox.sources.rabbitmq import RabbitMQSource
from outbox.transport import BrokerUnavailable
from relay.publishers.rabbitmq import RabbitMQPublisher
from tests.integration.relay.publishers_fixtures import TcpProxy, envelope, outgoing, unique
from tests.integration.sources.sources_fixtures import RecordingIngest, drain, nothing_more
from tests.support import services


@pytest.fixture
def amqp() -> Iterator[tuple[str, list[str], list[str]]]:
    """(url, queues to delete, exchanges to delete)"""
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")
    queues: list[str] = []
    exchanges: list[str] = []
    yield services.RABBITMQ_URL, queues, exchanges
    with contextlib.closing(
        pika.BlockingConnection(pika.URLParameters(services.RABBITMQ_URL))
    ) as conn:
        channel = conn.channel()
        for name in queues:
            channel.queue_delete(name)
        for name in exchanges:
            channel.exchange_delete(name)


def test_fanout_groups_each_get_every_message(amqp: tuple[str, list[str], list[str]]) -> None:
    url, queues, exchanges = amqp
    queue = unique("fan-")
    exchanges.append(f"{queue}_1")
    queues += [f"{queue}_1.billing", f"{queue}_1.shipping"]
    # Given two consumer services, each with its own queue bound to the relay's exchange
    billing = RabbitMQSource(url, [queue], [1], fanout_group="billing")
    shipping = RabbitMQSource(url, [queue], [1], fanout_group="shipping")
    ingest_b, ingest_s = RecordingIngest(), RecordingIngest()
    try:
        billing.run_once(ingest_b, 10, 0.1)  # declares and binds
        shipping.run_once(ingest_s, 10, 0.1)
        # When the relay publishes in fan-out mode
        sent = [envelope(queue) for _ in range(6)]
        publisher = RabbitMQPublisher(url, fanout=True, confirm_timeout=10)
        try:
            assert publisher.publish(outgoing(sent)) == {e.outbox_id: None for e in sent}
        finally:
            publisher.close()
        # Then each service receives all of them
        assert drain(billing, ingest_b, 6) == 6
        assert drain(shipping, ingest_s, 6) == 6
        assert nothing_more(billing, 0.5) and nothing_more(shipping, 0.5)
    finally:
        billing.close()
        shipping.close()
    by_id = sorted(sent, key=lambda e: e.outbox_id)
    assert sorted(ingest_b.envelopes, key=lambda e: e.outbox_id) == by_id
    assert sorted(ingest_s.envelopes, key=lambda e: e.outbox_id) == by_id


def test_queue_arguments_match_the_publishers(amqp: tuple[str, list[str], list[str]]) -> None:
    url, queues, _ = amqp
    queue = unique("args-")
    queues.append(f"{queue}_1")
    arguments = {"x-max-length": 1000}
    publisher = RabbitMQPublisher(url, queue_arguments=arguments, confirm_timeout=10)
    message = envelope(queue)
    try:
        assert publisher.publish(outgoing([message])) == {message.outbox_id: None}
    finally:
        publisher.close()
    # the same arguments: the declaration is accepted and the message arrives
    source = RabbitMQSource(url, [queue], [1], queue_arguments=arguments)
    ingest = RecordingIngest()
    try:
        assert drain(source, ingest, 1) == 1
    finally:
        source.close()
    assert ingest.envelopes == [message]
    # other explicit arguments: RabbitMQ refuses the declaration, and the source says so
    mismatched = RabbitMQSource(url, [queue], [1], queue_arguments={"x-max-length": 5})
    try:
        with pytest.raises(BrokerUnavailable, match="PRECONDITION_FAILED|inequivalent arg"):
            mismatched.run_once(ingest, 1, 0.1)
    finally:
        mismatched.close()
    # no arguments of its own (the worker CLI's case): the relay's queue is consumed as it is
    later = envelope(queue)
    publisher = RabbitMQPublisher(url, queue_arguments=arguments, confirm_timeout=10)
    try:
        assert publisher.publish(outgoing([later])) == {later.outbox_id: None}
    finally:
        publisher.close()
    plain = RabbitMQSource(url, [queue], [1])
    try:
        assert drain(plain, ingest, 1) == 1
    finally:
        plain.close()
    assert ingest.envelopes == [message, later]


def test_connection_cut_then_back_loses_nothing(amqp: tuple[str, list[str], list[str]]) -> None:
    url, queues, _ = amqp
    queue = unique("cut-")
    queues.append(f"{queue}_1")
    sent = [envelope(queue) for _ in range(20)]
    publisher = RabbitMQPublisher(url, confirm_timeout=10)
    try:
        assert set(publisher.publish(outgoing(sent)).values()) == {None}
    finally:
        publisher.close()
    proxy = TcpProxy(("127.0.0.1", 5672)).start()
    source = RabbitMQSource(
        url.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}"), [queue], [1], prefetch=5
    )
    ingest = RecordingIngest()
    try:
        before = drain(source, ingest, 5, max_messages=5)
        assert 5 <= before < 20
        # When the connection is cut (the prefetched, unacked deliveries are requeued)
        proxy.cut()
        with pytest.raises(BrokerUnavailable):
            source.run_once(ingest, 5, 1.0)
        with pytest.raises(BrokerUnavailable):  # still down: reconnecting fails the same way
            source.run_once(ingest, 5, 1.0)
        # Then, once it is back, run_once reconnects and the rest arrives. Counting is not
        # enough: an ack still in the client's buffer at the cut never reached the broker, so
        # those messages come again (at least once; the inbox absorbs the copies).
        proxy.restore()
        want = {str(e.event_id) for e in sent}
        deadline = time.monotonic() + 60
        while not want <= {str(e.event_id) for e in ingest.envelopes}:
            assert time.monotonic() < deadline, "the rest did not arrive within 60 s"
            source.run_once(ingest, 5, 0.5)
    finally:
        source.close()
        proxy.cut()
    received = [str(e.event_id) for e in ingest.envelopes]
    assert set(received) == {str(e.event_id) for e in sent}
