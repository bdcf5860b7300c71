"""Publishers by broker URL: ``amqp://`` -> RabbitMQ, ``kafka://host:port[,host2]`` -> Kafka."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from outbox.dsn import mask
from outbox.errors import ConfigError
from outbox.transport import Publisher

SCHEMES = ("amqp", "amqps", "kafka")


def check_broker_url(option: str, url: str) -> None:
    """``scheme://host...``, and no user:password for Kafka (SASL goes in its config): a
    mistyped URL is refused here, masked, before a client echoes it (host, vhost) unmasked."""
    if "://" not in url or not url.split("://", 1)[1].strip("/"):
        raise ConfigError(
            f"{option}: {mask(url)!r} is not a URL like amqp://user:pass@host:5672/vhost "
            "or kafka://host:9092"
        )
    if url.lower().startswith("kafka://") and "@" in url:
        raise ConfigError(
            f"{option}: {mask(url)!r}: kafka:// takes host:port[,host2:port] only, no user:password"
        )


def publisher_from_url(url: str, **options: Any) -> Publisher:
    """Build the publisher for ``url``; ``options`` go to the publisher's constructor.

    The Kafka client is imported only when a ``kafka://`` URL is used, so a RabbitMQ-only
    deployment never loads librdkafka.
    """
    if not url:
        raise ConfigError("broker: empty; pass --broker or set OUTBOX_BROKER")
    check_broker_url("broker", url)
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("amqp", "amqps"):
        from relay.publishers.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(url, **options)
    if scheme == "kafka":
        bootstrap = url.split("://", 1)[1].strip("/")
        if not bootstrap:
            raise ConfigError(f"broker: {mask(url)!r} names no host")
        from relay.publishers.kafka import KafkaPublisher  # type: ignore[import-not-found,unused-ignore]

        publisher: Publisher = KafkaPublisher(bootstrap, **options)
        return publisher
    raise ConfigError(f"broker: {mask(url)!r} has scheme {scheme!r}; expected amqp:// or kafka://")
