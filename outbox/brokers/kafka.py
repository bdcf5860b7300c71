"""Kafka through confluent-kafka (librdkafka), for the relay's publisher and the inbox's source.

What both directions share: the client settings every client gets (``client_config``),
creating the topics ``<queue>_<priority>`` when missing (``ensure_topics``), and how the
client's errors read in logs and reasons.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from outbox.brokers import PARTITIONS as PARTITIONS
from outbox.transport import BrokerUnavailable

log = logging.getLogger(__name__)
# librdkafka's log lines, of producers and consumers alike; outbox.logs gives this name the
# libraries' level (a unit test keeps the two in step).
CLIENT_LOGGER = "outbox.brokers.kafka.librdkafka"
_client_log = logging.getLogger(CLIENT_LOGGER)


def client_config(bootstrap: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Common librdkafka settings: bootstrap, logs into Python logging (never to stderr)."""
    merged: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _client_log}
    merged.update(config or {})
    return merged


def ensure_topics(
    admin: AdminClient, names: Iterable[str], partitions: int, timeout: float
) -> None:
    """Create the topics that do not exist yet (an existing topic is left as it is)."""
    wanted = sorted(set(names))
    if not wanted:
        return
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise BrokerUnavailable(f"cannot list topics: {text(exc)}") from exc
    missing = [name for name in wanted if name not in existing]
    if not missing:
        return
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication_factor=-1) for name in missing],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # another relay or worker created it meanwhile
            raise BrokerUnavailable(f"cannot create topic {name!r}: {text(exc)}") from exc
        except Exception as exc:  # concurrent.futures.TimeoutError and friends
            raise BrokerUnavailable(f"cannot create topic {name!r}: {text(exc)}") from exc
        log.info("created topic %s with %d partitions", name, partitions)


def reason(error: KafkaError | None) -> str:
    """``NAME: text`` of a client or broker error."""
    if error is None:
        return "unknown error"
    return f"{error.name()}: {error.str()}"


def text(exc: BaseException) -> str:
    """An exception as a reason: the KafkaError inside a KafkaException, else ``Type: text``."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return reason(exc.args[0])
    return f"{type(exc).__name__}: {exc}"
