"""Publishers by broker URL: ``amqp://`` -> RabbitMQ, ``kafka://host:port[,host2]`` -> Kafka."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outbox.brokers.urls import broker_of, kafka_bootstrap
from outbox.errors import ConfigError

if TYPE_CHECKING:
    from outbox.transport import Publisher


def publisher_from_url(url: str, **options: Any) -> Publisher:
    """Build the publisher for ``url``; ``options`` go to the publisher's constructor
    (``PublisherSettings.options_for(url)`` gives those of the relay's settings).

    The Kafka client is imported only when a ``kafka://`` URL is used, so a RabbitMQ-only
    deployment never loads librdkafka.
    """
    if not url:
        raise ConfigError("broker: empty; pass --broker or set OUTBOX_BROKER")
    if broker_of("broker", url) == "rabbitmq":
        from relay.publishers.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(url, **options)
    from relay.publishers.kafka import KafkaPublisher  # type: ignore[import-not-found,unused-ignore]

    publisher: Publisher = KafkaPublisher(kafka_bootstrap(url), **options)
    return publisher
