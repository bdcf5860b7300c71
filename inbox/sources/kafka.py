"""Kafka source: a consumer group on the ``<queue>_<priority>`` topics, urgent topics first.

- Offsets are committed synchronously, and only after ``ingest`` returned (the inbox rows are
  committed). If ingest raises, the consumed partitions are sought back to the batch's first
  offsets, so the same messages come again; after a crash or a rebalance they come from the
  last committed offset (the inbox absorbs the duplicates).
- Priority: a partition is drained when the next offset we will hand over (known from the
  last message, EOF event or seek) reaches the high watermark librdkafka last saw in a fetch
  response (cached: no network call). The "level" is the most urgent priority with an
  assigned partition not drained (or not yet known); partitions of less urgent priorities
  are paused, which also discards what librdkafka had prefetched for them, so urgent messages
  never queue behind a prefetched backlog. A batch that still mixes priorities keeps only the
  most urgent messages; the partitions of the others are sought back to their first dropped
  offset (nothing is skipped, nothing committed).
- Topics are created when missing (same partitions default as the publisher): subscribing
  to a topic that does not exist yet would otherwise wait for a metadata refresh.
- Group timing, see docs/kafka.md: some Kafka-protocol brokers (tansu) hold the JoinGroup
  answer for half of ``session.timeout.ms``, so the default here is 6 s (a 3 s join), the
  smallest value Apache Kafka accepts by default.

- Right after connecting, ``run_once`` waits past its timeout until the topics are drained
  (or ``session.timeout.ms`` + 10 s): the group join takes seconds, and "nothing yet" must not
  read as "empty" to a worker that stops when idle. ``drained()`` answers that at any time.

``close()`` may be called from another thread while ``run_once`` runs (the worker does):
the consumer is then closed by ``run_once`` as it returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from inbox.sources.thread_safe import ThreadSafeSource
from outbox.brokers.kafka import PARTITIONS, client_config, ensure_topics, reason
from outbox.transport import Ingest, Rejected
from outbox.wire import Envelope, MalformedMessageError, from_wire, routing_name

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 1000,
    # An empty partition answers a fetch after this long; it bounds how late an EOF (and so
    # the move to the next priority) comes.
    "fetch.wait.max.ms": 100,
    "topic.metadata.refresh.interval.ms": 10000,
}
# Set by us whatever the caller passes: they are what the offset and priority logic rely on.
FORCED: dict[str, Any] = {"enable.auto.commit": False, "enable.partition.eof": True}

_TP = tuple[str, int]


class KafkaSource(ThreadSafeSource):
    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        queues: Sequence[str],
        priorities: Sequence[int],
        *,
        config: dict[str, Any] | None = None,
        partitions: int = PARTITIONS,
    ) -> None:
        super().__init__(queues, priorities)
        if not group_id:
            raise ValueError("group_id: empty")
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.partitions = partitions
        self.config = dict(config or {})
        self._priority_of = {routing_name(q, p): p for p in self.priorities for q in queues}
        self._consumer: Consumer | None = None
        self._assigned: set[_TP] = set()
        self._paused: set[_TP] = set()
        self._next: dict[_TP, int] = {}  # next offset run_once will hand over, when known
        self._starting_until = 0.0  # monotonic time until which run_once waits for a join

    def __repr__(self) -> str:
        return f"KafkaSource({self.bootstrap!r}, group={self.group_id!r})"

    @property
    def topics(self) -> list[str]:
        return sorted(self._priority_of, key=lambda t: (self._priority_of[t], t))

    # -- Source -------------------------------------------------------------------------------

    def drained(self) -> bool:
        """True when the group gave us partitions and every one is consumed to its end (as
        far as the last fetch responses tell). Before the first assignment it is False:
        "nothing received yet" is not "nothing to receive" (a join takes seconds)."""
        consumer, assigned = self._consumer, tuple(self._assigned)  # may run in another thread
        if consumer is None or not assigned or self._closing:
            return False
        try:
            return all(self._drained(consumer, tp) for tp in assigned)
        except (KafkaException, RuntimeError):  # closed meanwhile
            return False

    # -- receiving ----------------------------------------------------------------------------

    def _run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        consumer = self._consumer or self._connect()
        deadline = time.monotonic() + timeout
        batch: list[Message] = []
        while not batch:
            self._apply_level(consumer)
            remaining = deadline - time.monotonic()
            if self._closing:
                return 0
            if remaining <= 0:
                if self._starting_until > time.monotonic() and not self.drained():
                    # Joining the group takes seconds: until the topics are known to be
                    # drained, "nothing yet" would read as "empty" to a worker that stops
                    # when idle. Only the first calls after connecting wait this way.
                    deadline = time.monotonic() + 0.2
                    continue
                self._starting_until = 0.0
                return 0
            first = consumer.poll(min(remaining, 0.2))  # short: a close() is seen quickly
            if first is None:
                continue
            events = (
                [first, *consumer.consume(max_messages - 1, 0)] if max_messages > 1 else [first]
            )
            batch = self._sort_events(events)
        batch = self._most_urgent_only(consumer, batch)

        messages = [_parse(m) for m in batch]
        try:
            ingest(messages)
        except BaseException:
            self._rewind(consumer, batch)
            raise
        self._commit(consumer, batch)
        return len(batch)

    def _sort_events(self, events: Sequence[Message]) -> list[Message]:
        """Messages in order; EOF and error events update the state and are dropped."""
        messages: list[Message] = []
        for event in events:
            error = event.error()
            tp = (event.topic() or "", event.partition() or 0)
            if error is None:
                self._next[tp] = (event.offset() or 0) + 1
                messages.append(event)
            elif error.code() == KafkaError._PARTITION_EOF:
                self._next[tp] = event.offset() or 0
            else:
                log.warning("Kafka consumer: %s", reason(error))
        return messages

    def _drained(self, consumer: Consumer, tp: _TP) -> bool:
        position = self._next.get(tp)
        if position is None:
            return False  # not known yet: assume it holds messages
        _low, high = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
        return high < 0 or high <= position

    def _level(self, consumer: Consumer) -> int | None:
        """The most urgent priority with an assigned partition that may hold messages."""
        for priority in self.priorities:
            for tp in self._assigned:
                if self._priority_of.get(tp[0]) == priority and not self._drained(consumer, tp):
                    return priority
        return None

    def _apply_level(self, consumer: Consumer) -> None:
        level = self._level(consumer)
        wanted = (
            set()
            if level is None
            else {tp for tp in self._assigned if self._priority_of.get(tp[0], 0) > level}
        )
        to_pause, to_resume = wanted - self._paused, self._paused - wanted
        if to_pause:
            consumer.pause([TopicPartition(t, p) for t, p in to_pause])
        if to_resume:
            consumer.resume([TopicPartition(t, p) for t, p in to_resume])
        self._paused = wanted

    def _most_urgent_only(self, consumer: Consumer, batch: list[Message]) -> list[Message]:
        urgent = min(self._priority_of.get(m.topic() or "", 0) for m in batch)
        keep: list[Message] = []
        drop: list[Message] = []
        for m in batch:
            (keep if self._priority_of.get(m.topic() or "", 0) == urgent else drop).append(m)
        if drop:
            self._rewind(consumer, drop)
        return keep

    def _rewind(self, consumer: Consumer, messages: Sequence[Message]) -> None:
        """Seek each partition back to its first offset among ``messages``."""
        first: dict[_TP, int] = {}
        for m in messages:
            tp = (m.topic() or "", m.partition() or 0)
            first[tp] = min(first.get(tp, m.offset() or 0), m.offset() or 0)
        for (topic, partition), offset in first.items():
            try:
                consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                # Not assigned any more (rebalance): its new owner starts from the committed
                # offset, which is before these messages.
                log.info("seek %s[%d] to %d: %s", topic, partition, offset, exc)
            self._next[(topic, partition)] = offset

    def _commit(self, consumer: Consumer, batch: Sequence[Message]) -> None:
        upto: dict[_TP, int] = {}
        for m in batch:
            tp = (m.topic() or "", m.partition() or 0)
            upto[tp] = max(upto.get(tp, -1), (m.offset() or 0) + 1)
        offsets = [TopicPartition(t, p, o) for (t, p), o in upto.items()]
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # The rows are durable; the messages will come once more (after a rebalance or a
            # restart) and the inbox counts them as duplicates.
            log.warning("Kafka offset commit failed (messages will be redelivered): %s", exc)

    # -- group membership ---------------------------------------------------------------------

    def _connect(self) -> Consumer:
        settings = client_config(self.bootstrap, {**DEFAULTS, **self.config, **FORCED})
        settings["group.id"] = self.group_id
        admin = AdminClient(client_config(self.bootstrap, self._admin_config()))
        ensure_topics(admin, self.topics, self.partitions, timeout=10.0)
        consumer = Consumer(settings)
        session = float(settings.get("session.timeout.ms", 45000)) / 1000
        self._starting_until = time.monotonic() + session + 10.0
        consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
        self._consumer = consumer
        log.info("Kafka consumer group %s on %s", self.group_id, ", ".join(self.topics))
        return consumer

    def _admin_config(self) -> dict[str, Any]:
        # security settings apply to the admin client too; consumer-only ones do not
        consumer_only = set(DEFAULTS) | set(FORCED) | {"group.id", "group.instance.id"}
        return {k: v for k, v in self.config.items() if k not in consumer_only}

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(partitions)
        self._assigned = {(tp.topic, tp.partition) for tp in partitions}
        self._paused = set()
        self._next = {}
        # Pause the less urgent partitions before the first fetch returns anything.
        self._apply_level(consumer)
        log.info("assigned %d partition(s)", len(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.unassign()
        self._assigned = set()
        self._paused = set()
        self._next = {}

    def _shutdown(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()  # leaves the group: the partitions move at once
            except (KafkaException, RuntimeError) as exc:
                log.debug("closing Kafka consumer: %s", exc)


def _parse(message: Message) -> Envelope | Rejected:
    raw = message.headers() or []
    # consumed messages always carry a list of (name, value) pairs
    pairs: list[tuple[str, Any]] = list(raw.items()) if isinstance(raw, dict) else list(raw)
    headers = dict(pairs)
    try:
        if not pairs:
            raise MalformedMessageError("headers", "missing")
        return from_wire(headers, message.value())
    except MalformedMessageError as exc:
        return Rejected(
            reason=str(exc),
            headers={
                k: v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
                for k, v in headers.items()
                if v is not None
            },
            body=message.value() or b"",
            origin=f"kafka:{message.topic()}[{message.partition()}]@{message.offset()}",
        )
