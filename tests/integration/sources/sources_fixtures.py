"""Broker sources under test: one ``SourceCase`` per broker, plus recording ingests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import pika
import pytest
from confluent_kafka import Producer

from outbox.transport import Ingest, Publisher, Rejected, Source
from outbox.wire import Envelope, routing_name
from relay.publishers.kafka import KafkaPublisher
from tests.integration.relay.publishers_fixtures import outgoing, unique
from tests.support import services
from tests.support.kafka import KafkaBroker

Received = Envelope | Rejected


class RecordingIngest:
    """Records every batch; ``fail`` makes the next calls raise (nothing may be acked)."""

    def __init__(self) -> None:
        self.batches: list[list[Received]] = []
        self.fail = False
        self.calls = 0

    def __call__(self, messages: Sequence[Received]) -> None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("database down (test)")
        self.batches.append(list(messages))

    @property
    def messages(self) -> list[Received]:
        return [m for batch in self.batches for m in batch]

    @property
    def envelopes(self) -> list[Envelope]:
        return [m for m in self.messages if isinstance(m, Envelope)]


class SlowIngest(RecordingIngest):
    """Takes ``seconds`` per batch, like a database commit."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def __call__(self, messages: Sequence[Received]) -> None:
        time.sleep(self.seconds)
        super().__call__(messages)


def drain(
    source: Source,
    ingest: Ingest,
    count: int,
    *,
    max_messages: int = 100,
    timeout: float = 30.0,
) -> int:
    """Call run_once until ``count`` messages were taken or ``timeout``; returns the count."""
    taken = 0
    deadline = time.monotonic() + timeout
    while taken < count and time.monotonic() < deadline:
        taken += source.run_once(ingest, max_messages, 0.5)
    return taken


def nothing_more(source: Source, seconds: float = 2.0) -> bool:
    """True when run_once hands over nothing during ``seconds``."""
    ingest = RecordingIngest()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        source.run_once(ingest, 100, 0.3)
    return not ingest.messages


class SourceCase:
    name = "?"

    def publisher(self) -> Publisher:
        raise NotImplementedError

    def source(self, queues: Sequence[str], priorities: Sequence[int], **kw: Any) -> Source:
        raise NotImplementedError

    def publish(self, envelopes: list[Envelope]) -> None:
        publisher = self.publisher()
        try:
            result = publisher.publish(outgoing(envelopes))
        finally:
            publisher.close()
        assert set(result.values()) == {None}

    def publish_raw(
        self, queue: str, priority: int, headers: dict[str, str] | None, body: bytes
    ) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass


class KafkaSourceCase(SourceCase):
    name = "kafka"
    # the group join waits half of this on tansu (docs/kafka.md); small keeps tests quick
    CONFIG: ClassVar[dict[str, Any]] = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500}

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        self.partitions = 3

    def publisher(self) -> Publisher:
        return KafkaPublisher(self.broker.bootstrap, partitions=self.partitions, confirm_timeout=10)

    def source(self, queues: Sequence[str], priorities: Sequence[int], **kw: Any) -> Source:
        from inbox.sources.kafka import KafkaSource

        group = kw.pop("group", None) or unique("group-")
        config = {**self.CONFIG, **kw.pop("config", {})}
        return KafkaSource(
            self.broker.bootstrap,
            group,
            queues,
            priorities,
            config=config,
            partitions=self.partitions,
            **kw,
        )

    def publish_raw(
        self, queue: str, priority: int, headers: dict[str, str] | None, body: bytes
    ) -> None:
        producer = Producer({"bootstrap.servers": self.broker.bootstrap})
        producer.produce(
            routing_name(queue, priority),
            value=body,
            headers=cast("dict[str, str | bytes | None] | None", headers),
        )
        assert producer.flush(10) == 0


class RabbitMQSourceCase(SourceCase):
    name = "rabbitmq"

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        if not services.port_open("127.0.0.1", 5672):
            services.missing("rabbitmq", "127.0.0.1:5672 closed")
        self.url = services.RABBITMQ_URL
        self.queues: set[str] = set()

    def publisher(self) -> Publisher:
        from relay.publishers.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(self.url, confirm_timeout=10)

    def source(self, queues: Sequence[str], priorities: Sequence[int], **kw: Any) -> Source:
        from inbox.sources.rabbitmq import RabbitMQSource

        kw.pop("group", None)  # every RabbitMQ consumer of a queue shares it
        kw.pop("config", None)
        self.queues |= {routing_name(q, p) for q in queues for p in priorities}
        return RabbitMQSource(self.url, queues, priorities, **kw)

    def publish(self, envelopes: list[Envelope]) -> None:
        self.queues |= {routing_name(e.queue, e.priority) for e in envelopes}
        super().publish(envelopes)

    def publish_raw(
        self, queue: str, priority: int, headers: dict[str, str] | None, body: bytes
    ) -> None:
        name = routing_name(queue, priority)
        self.queues.add(name)
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(self.url))) as conn:
            channel = conn.channel()
            channel.queue_declare(name, durable=True)
            channel.basic_publish(
                "", name, body, pika.BasicProperties(headers=headers, delivery_mode=2)
            )

    def cleanup(self) -> None:
        if not self.queues:
            return
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(self.url))) as conn:
            channel = conn.channel()
            for name in self.queues:
                channel.queue_delete(name)


SOURCE_CASES: dict[str, Callable[[pytest.FixtureRequest, Path], SourceCase]] = {
    "kafka": KafkaSourceCase,
    "rabbitmq": RabbitMQSourceCase,
}


def consume_then_hang(kind: str, address: str, group: str, queue: str, out: str) -> None:
    """Child process: take one batch, record its event ids, then hang inside ingest (so
    nothing is acked) until the parent SIGKILLs it."""
    source: Source
    if kind == "kafka":
        from inbox.sources.kafka import KafkaSource

        source = KafkaSource(address, group, [queue], [1], config=KafkaSourceCase.CONFIG)
    else:
        from inbox.sources.rabbitmq import RabbitMQSource

        source = RabbitMQSource(address, [queue], [1], prefetch=10)

    def ingest(messages: Sequence[Received]) -> None:
        ids = [str(m.event_id) for m in messages if isinstance(m, Envelope)]
        Path(out).write_text("\n".join(ids))
        while True:
            time.sleep(1)

    while True:
        source.run_once(ingest, 5, 1.0)


def group_member(bootstrap: str, group: str, queue: str, workdir: str, name: str) -> None:
    """Child process: one member of a Kafka consumer group; appends every event id it ingests
    to ``<name>.ids`` and writes its assignment to ``<name>.assigned``, until ``stop`` exists."""
    from confluent_kafka import Consumer as _Consumer
    from confluent_kafka import TopicPartition as _TopicPartition

    from inbox.sources.kafka import KafkaSource

    folder = Path(workdir)

    class Member(KafkaSource):
        def _on_assign(self, consumer: _Consumer, partitions: list[_TopicPartition]) -> None:
            super()._on_assign(consumer, partitions)
            (folder / f"{name}.assigned").write_text(str(len(partitions)))

    source = Member(bootstrap, group, [queue], [1], config=KafkaSourceCase.CONFIG, partitions=4)

    def ingest(messages: Sequence[Received]) -> None:
        with (folder / f"{name}.ids").open("a") as out:
            for m in messages:
                if isinstance(m, Envelope):
                    out.write(f"{m.event_id}\n")

    while not (folder / "stop").exists():
        source.run_once(ingest, 20, 0.2)
    source.close()
