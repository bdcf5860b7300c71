"""Where a worker's messages come from: the database (default), RabbitMQ or Kafka."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine

from outbox.errors import ConfigError
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
    from relay.publishers import check_broker_url

    check_broker_url("source", url)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("amqp", "amqps"):
        from inbox.sources.rabbitmq import RabbitMQSource

        source: Source = RabbitMQSource(url, list(queues), list(priorities), prefetch=prefetch)
        return source
    if scheme == "kafka":
        from inbox.sources.kafka import KafkaSource

        bootstrap = url.split("://", 1)[1].strip("/")
        source = KafkaSource(bootstrap, consumer_name, list(queues), list(priorities))
        return source
    raise ConfigError(f"source: {scheme or url!r} is not a broker URL (amqp://... or kafka://...)")
