"""Where a worker's messages come from: the database (default), RabbitMQ or Kafka."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine

from outbox.brokers.urls import broker_of, kafka_bootstrap
from outbox.transport import Source


def source_from_url(
    url: str | None,
    *,
    engine: Engine,
    queues: Sequence[str],
    priorities: Sequence[int],
    consumer_name: str,
    prefetch: int = 100,
) -> Source:
    """None or "" -> the database source; ``amqp://`` -> RabbitMQ; ``kafka://`` -> Kafka.

    Broker sources are imported lazily: a database-only deployment needs neither client.
    """
    if not url:
        from inbox.sources.database import DatabaseSource

        return DatabaseSource(engine, queues)
    source: Source
    if broker_of("source", url) == "rabbitmq":
        from inbox.sources.rabbitmq import RabbitMQSource

        source = RabbitMQSource(url, list(queues), list(priorities), prefetch=prefetch)
    else:
        from inbox.sources.kafka import KafkaSource

        source = KafkaSource(kafka_bootstrap(url), consumer_name, list(queues), list(priorities))
    return source
