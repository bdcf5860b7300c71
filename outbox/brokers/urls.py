"""Broker URLs: ``amqp://`` / ``amqps://`` -> RabbitMQ, ``kafka://host:port[,host2]`` -> Kafka.

A mistyped URL is refused here, masked, before a client library echoes it (host, vhost,
password) unmasked.
"""

from __future__ import annotations

from typing import Literal

from outbox.dsn import mask
from outbox.errors import ConfigError

Broker = Literal["rabbitmq", "kafka"]
_BROKERS: dict[str, Broker] = {"amqp": "rabbitmq", "amqps": "rabbitmq", "kafka": "kafka"}
SCHEMES = tuple(_BROKERS)


def check_broker_url(option: str, url: str) -> None:
    """``scheme://host...``, and no user:password for Kafka (SASL goes in its config)."""
    if "://" not in url or not url.split("://", 1)[1].strip("/"):
        raise ConfigError(
            f"{option}: {mask(url)!r} is not a URL like amqp://user:pass@host:5672/vhost "
            "or kafka://host:9092"
        )
    if url.lower().startswith("kafka://") and "@" in url:
        raise ConfigError(
            f"{option}: {mask(url)!r}: kafka:// takes host:port[,host2:port] only, no user:password"
        )


def broker_of(option: str, url: str) -> Broker:
    """Check ``url`` (``option`` names it in errors) and say which broker it names."""
    check_broker_url(option, url)
    scheme = url.split("://", 1)[0].lower()
    broker = _BROKERS.get(scheme)
    if broker is None:
        raise ConfigError(
            f"{option}: {mask(url)!r} is not a broker URL: scheme {scheme!r}; "
            "expected amqp://... or kafka://..."
        )
    return broker


def kafka_bootstrap(url: str) -> str:
    """``kafka://h1:9092,h2:9092/`` -> ``h1:9092,h2:9092`` (never empty once checked)."""
    return url.split("://", 1)[1].strip("/")
