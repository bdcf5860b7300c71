"""``outbox check --broker`` against the real brokers: RabbitMQ (service) and tansu (Kafka)."""

from __future__ import annotations

from outbox.ops.check import check_broker
from tests.support.kafka import KafkaBroker
from tests.support.services import RABBITMQ_URL, missing, port_open


def test_rabbitmq_reachable_and_not() -> None:
    if not port_open("127.0.0.1", 5672):
        missing("rabbitmq", "nothing on 127.0.0.1:5672")
    assert check_broker(RABBITMQ_URL).ok
    wrong = check_broker("amqp://guest:hunter2@127.0.0.1:1/%2F", timeout=2)
    assert not wrong.ok
    assert "hunter2" not in wrong.detail and "***" in wrong.detail


def test_kafka_reachable_and_not(kafka_broker: KafkaBroker) -> None:
    result = check_broker(kafka_broker.url)
    assert result.ok, result.detail
    assert not check_broker("kafka://127.0.0.1:1", timeout=1).ok


def test_unknown_scheme() -> None:
    result = check_broker("redis://localhost")
    assert not result.ok and "unknown scheme" in result.detail
