"""What the relay's publishers are built with, apart from their code: the CLI takes its
defaults from here without loading pika or librdkafka."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from outbox.brokers import PARTITIONS
from outbox.brokers.urls import broker_of
from outbox.errors import ConfigError


@dataclass(frozen=True)
class PublisherSettings:
    """The options of the relay's publishers, validated when built (a bad value raises
    ``ConfigError`` naming the field). Each publisher reads those of its broker:
    ``publisher_from_url(url, **settings.options_for(url))``."""

    confirm_timeout: float = 30.0
    """Seconds a batch may wait for the broker's confirms (RabbitMQ) or delivery reports
    (Kafka); then its outcome is unknown (``BrokerUnavailable``), the relay rolls it back and
    publishes it again later. Also the connect timeout. Default 30.0."""
    fanout: bool = False
    """RabbitMQ: publish to a durable fan-out exchange per ``<queue>_<priority>`` (each
    consumer service binds a queue of its own) instead of a queue. Default False."""
    queue_arguments: Mapping[str, Any] | None = None
    """RabbitMQ: the arguments of ``queue_declare`` (e.g. ``{"x-queue-type": "quorum"}``);
    the consumers must declare the same. Default None: none."""
    kafka_partitions: int = PARTITIONS
    """Kafka: partitions of the topics the relay creates. Default 3 (``PARTITIONS`` of
    outbox.brokers, which the Kafka source uses too)."""

    def __post_init__(self) -> None:
        if self.confirm_timeout <= 0:
            raise ConfigError(f"confirm_timeout: must be > 0, got {self.confirm_timeout}")
        if self.kafka_partitions < 1:
            raise ConfigError(f"kafka_partitions: must be >= 1, got {self.kafka_partitions}")

    def options_for(self, url: str) -> dict[str, Any]:
        """The keyword arguments of ``url``'s publisher; a bad URL raises ``ConfigError``."""
        options: dict[str, Any] = {"confirm_timeout": self.confirm_timeout}
        if broker_of("broker", url) == "rabbitmq":
            options["fanout"] = self.fanout
            if self.queue_arguments:
                options["queue_arguments"] = dict(self.queue_arguments)
        else:
            options["partitions"] = self.kafka_partitions
        return options
