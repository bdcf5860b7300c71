"""Kafka publisher: confluent-kafka, idempotent, ``acks=all``, delivery reports per row.

One ``produce()`` per message (key = ``envelope.key``, headers = ``wire_headers()``, value =
``wire_body()``) into topic ``<queue>_<priority>``, created on first use; then the producer is
flushed until its queue is empty. Only failed messages get a delivery report
(``delivery.report.only.error``): a message without one once the queue is empty was
acknowledged (``acks=all``). Mapping of outcomes (the Publisher contract of outbox.transport):

- delivered                                   -> confirmed
- refused by the client or the broker for this message (too large, invalid record, policy)
                                              -> refused, with the broker's reason
- the producer itself is broken (fenced, idempotence sequence lost)
                                              -> a new producer is made and those messages
                                                 are produced again inside the same call
- timeout, transport error, all brokers down  -> ``BrokerUnavailable`` (queue purged, producer
                                                 dropped; ``connect()`` makes a new one)

Why the "broken producer" case: after a broker refuses a record batch, the idempotent
producer's sequence numbers no longer match the broker's; Apache Kafka lets librdkafka bump
the epoch, but other Kafka-protocol brokers (tansu, used by our tests) answer every later
message with PRODUCER_FENCED. Without a fresh producer one refused row would dead-letter
every row after it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from outbox.brokers.kafka import client_config, ensure_topics, reason, text
from outbox.transport import BrokerUnavailable, Outgoing
from relay.publishers.settings import PublisherSettings

log = logging.getLogger(__name__)

# Broker or client verdicts about one message: retrying the same bytes cannot succeed.
_REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_REQUIRED_ACKS,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError._INVALID_ARG,
    }
)
# The producer instance is unusable; a new one will do.
_BROKEN_PRODUCER = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError._FENCED,
        KafkaError._FATAL,
    }
)
# A record batch the broker refused as a whole: each message is tried alone to find the bad one.
_BATCH_WIDE = frozenset({KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG})
_ROUNDS = 4  # new producers in a row that decide nothing before the outcome is "unknown"


@dataclass
class _Report:
    """The failure report of one message, if librdkafka sends one."""

    row_id: int
    error: KafkaError | None = None


class KafkaPublisher:
    """Publishes to topics ``<queue>_<priority>``; see the module docstring for outcomes.

    ``config``: extra librdkafka settings (security, ``message.max.bytes``, ...); it may not
    turn idempotence or ``acks=all`` off. ``confirm_timeout``: how long a batch may wait for
    its delivery reports before the outcome is declared unknown (``BrokerUnavailable``). The
    defaults: ``relay.publishers.settings.PublisherSettings``.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        partitions: int = PublisherSettings.kafka_partitions,
        config: dict[str, Any] | None = None,
        confirm_timeout: float = PublisherSettings.confirm_timeout,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions: must be at least 1, not {partitions}")
        if confirm_timeout <= 0:
            raise ValueError(f"confirm_timeout: must be positive, not {confirm_timeout}")
        for name, required in (("enable.idempotence", True), ("acks", "all")):
            if name in (config or {}) and str((config or {})[name]).lower() not in (
                str(required).lower(),
                "-1" if name == "acks" else "true",
            ):
                raise ValueError(f"config: {name} must stay {required!r} (no lost messages)")
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.config = dict(config or {})
        self.confirm_timeout = confirm_timeout
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None
        self._topics: set[str] = set()

    def __repr__(self) -> str:
        return f"KafkaPublisher({self.bootstrap!r}, partitions={self.partitions})"

    # -- connection ---------------------------------------------------------------------------

    def connect(self) -> None:
        """Make a fresh producer and check the cluster answers (``BrokerUnavailable`` if not)."""
        self.close()
        self._admin = AdminClient(client_config(self.bootstrap, self.config))
        try:
            self._admin.list_topics(timeout=min(10.0, self.confirm_timeout))
        except KafkaException as exc:
            self.close()
            raise BrokerUnavailable(f"cannot reach Kafka at {self.bootstrap}: {text(exc)}") from exc
        self._producer = self._new_producer()

    def _new_producer(self) -> Producer:
        settings = client_config(self.bootstrap, self.config)
        settings.update(
            {
                "enable.idempotence": True,
                "acks": "all",
                # Per-row outcomes come from failure reports alone: a report per delivered
                # message costs a Python call each and halves the throughput.
                "delivery.report.only.error": True,
                # librdkafka gives up on a message when we do, so no stale copy of a batch we
                # declared unknown is still being retried behind the next one.
                "message.timeout.ms": int(self.confirm_timeout * 1000),
                "partitioner": self.config.get("partitioner", "murmur2_random"),
            }
        )
        return Producer(settings)

    def idle(self) -> None:
        return None  # librdkafka serves its connections on its own threads

    def close(self) -> None:
        producer, self._producer, self._admin = self._producer, None, None
        self._topics.clear()  # a restarted broker may have lost them (in-memory test broker)
        if producer is not None:
            _discard(producer)

    # -- publishing ---------------------------------------------------------------------------

    def publish(self, batch: Sequence[Outgoing]) -> Mapping[int, str | None]:
        if not batch:
            return {}
        if self._producer is None or self._admin is None:
            self.connect()
        deadline = time.monotonic() + self.confirm_timeout
        result: dict[int, str | None] = {}
        # Groups of messages still to produce, in row order. A group comes back as smaller
        # groups when the producer had to be replaced, or when the broker refused a whole
        # record batch (then each message goes alone, so only the bad one is refused).
        todo: deque[list[Outgoing]] = deque([list(batch)])
        restarts = 0
        try:
            self._ensure_topics({item.destination for item in batch})
            while todo:
                group = todo.popleft()
                decided = len(result)
                again = _triage(group, self._produce_and_wait(group, deadline), result)
                if len(result) > decided:
                    # only new producers in a row that decide nothing count: each bad record
                    # costs one on tansu, and a batch may hold several bad records
                    restarts = 0
                if any(restart for restart, _ in again):
                    restarts += 1
                    if restarts > _ROUNDS:
                        raise BrokerUnavailable(
                            f"the Kafka producer kept failing ({restarts} new producers)"
                        )
                    log.warning("Kafka producer unusable; producing again with a new one")
                    self._replace_producer()
                todo.extendleft(reversed([messages for _, messages in again]))
            return result
        except BrokerUnavailable:
            self.close()
            raise

    def _replace_producer(self) -> None:
        if self._producer is not None:
            _discard(self._producer)
        self._producer = self._new_producer()

    def _ensure_topics(self, names: set[str]) -> None:
        assert self._admin is not None
        missing = names - self._topics
        if missing:
            ensure_topics(self._admin, missing, self.partitions, min(10.0, self.confirm_timeout))
            self._topics |= missing

    def _produce_and_wait(self, items: Sequence[Outgoing], deadline: float) -> dict[int, _Report]:
        producer = self._producer
        assert producer is not None
        reports = {item.row_id: _Report(item.row_id) for item in items}
        for item in items:
            report = reports[item.row_id]
            envelope = item.envelope
            while True:
                try:
                    producer.produce(
                        item.destination,
                        value=envelope.wire_body(),
                        key=envelope.key.encode("utf-8") if envelope.key is not None else None,
                        headers=cast("dict[str, str | bytes | None]", envelope.wire_headers()),
                        on_delivery=_callback(report),
                    )
                    break
                except BufferError:
                    # The local queue is full: serve delivery reports to make room.
                    if time.monotonic() >= deadline:
                        raise BrokerUnavailable("Kafka producer queue stayed full") from None
                    producer.poll(0.05)
                except KafkaException as exc:
                    # Refused before it left (over message.max.bytes, bad argument ...).
                    report.error = exc.args[0]
                    break
        # Only failures produce a delivery report (delivery.report.only.error): once the
        # producer's queue is empty every message without one was acknowledged by the broker.
        while True:
            remaining = deadline - time.monotonic()
            # flush(), not poll(): it also tells librdkafka to send now instead of lingering
            left = producer.flush(max(0.0, min(remaining, 0.5)))
            if left == 0:
                break
            if remaining <= 0:
                raise BrokerUnavailable(
                    f"no answer from {self.bootstrap} within {self.confirm_timeout}s "
                    f"for {left} of {len(items)} messages"
                )
        return reports


def _triage(
    group: Sequence[Outgoing], reports: Mapping[int, _Report], result: dict[int, str | None]
) -> list[tuple[bool, list[Outgoing]]]:
    """Record the confirmed and refused messages of ``group`` in ``result``; the rest come
    back in row order as (needs a new producer, messages) to produce again."""
    again: list[tuple[bool, list[Outgoing]]] = []
    for item in group:
        error = reports[item.row_id].error
        verdict = _classify(error)
        if verdict == "confirmed":
            result[item.row_id] = None
        elif verdict == "refused" and len(group) > 1 and _batch_wide(error):
            again.append((False, [item]))
        elif verdict == "refused":
            result[item.row_id] = reason(error)
        elif verdict != "restart":
            raise BrokerUnavailable(f"delivery to {item.destination} failed: {reason(error)}")
        elif again and again[-1][0]:
            again[-1][1].append(item)
        else:
            again.append((True, [item]))
    return again


def _callback(report: _Report) -> Any:
    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        report.error = error

    return on_delivery


def _classify(error: KafkaError | None) -> str:
    if error is None:
        return "confirmed"
    code = error.code()
    if code in _BROKEN_PRODUCER or error.fatal():
        return "restart"
    if code in _REFUSALS and not error.retriable():
        return "refused"
    return "unavailable"


def _batch_wide(error: KafkaError | None) -> bool:
    return error is not None and error.code() in _BATCH_WIDE


def _discard(producer: Producer) -> None:
    """Drop a producer without waiting: queued messages are purged, their outcome unknown."""
    try:
        producer.purge(in_queue=True, in_flight=True, blocking=False)
        producer.poll(0)
        producer.flush(0)
    except (KafkaException, RuntimeError) as exc:
        log.debug("discarding Kafka producer: %s", exc)
