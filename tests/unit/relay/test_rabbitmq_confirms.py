"""The confirm bookkeeping of the RabbitMQ publisher, fed frames by hand (no broker)."""

from __future__ import annotations

from types import SimpleNamespace

import pika
import pika.spec

from relay.publishers.rabbitmq import RabbitMQPublisher


def publisher_with(tags: dict[int, int]) -> RabbitMQPublisher:
    p = RabbitMQPublisher("amqp://guest:secret@127.0.0.1:1/%2F")
    p._tags = dict(tags)
    p._by_message_id = {f"m{row}": row for row in tags.values()}
    return p


def ack(tag: int, multiple: bool = False) -> SimpleNamespace:
    return SimpleNamespace(method=pika.spec.Basic.Ack(delivery_tag=tag, multiple=multiple))


def nack(tag: int, multiple: bool = False) -> SimpleNamespace:
    return SimpleNamespace(method=pika.spec.Basic.Nack(delivery_tag=tag, multiple=multiple))


def test_multiple_ack_settles_every_tag_up_to_it() -> None:
    p = publisher_with({1: 10, 2: 20, 3: 30})
    p._on_confirm(ack(2, multiple=True))
    assert p._result == {10: None, 20: None}
    assert p._tags == {3: 30}


def test_nack_refuses_with_a_reason() -> None:
    p = publisher_with({1: 10, 2: 20})
    p._on_confirm(nack(1))
    p._on_confirm(ack(2))
    assert p._result[10] is not None and "nack" in p._result[10]
    assert p._result[20] is None


def test_return_before_ack_makes_the_row_refused() -> None:
    p = publisher_with({1: 10, 2: 20})
    method = SimpleNamespace(reply_code=312, reply_text="NO_ROUTE", exchange="x_1", routing_key="")
    p._on_return(None, method, pika.BasicProperties(message_id="m10"), b"")
    p._on_confirm(ack(2, multiple=True))
    assert p._result[10] is not None and "NO_ROUTE" in p._result[10]
    assert p._result[20] is None


def test_size_limit_is_learnt_from_the_broker_error() -> None:
    p = RabbitMQPublisher("amqp://127.0.0.1:1/%2F")
    p._learn_size_limit(
        "(406, 'PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000')"
    )
    assert p.max_message_bytes == 1000


def test_repr_masks_the_password() -> None:
    assert "secret" not in repr(publisher_with({}))
