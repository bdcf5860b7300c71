"""Brokers for the publisher contract suite, one ``BrokerCase`` per publisher.

Adding a publisher to the contract = one case class here and one line in ``CASES``. Each case
knows how to build its publisher against the real broker, read a destination back with the
broker's plain client, make the broker refuse a message, and cut the broker off (outage).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika
import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.transport import Outgoing, Publisher
from outbox.wire import Envelope
from tests.support import services
from tests.support.kafka import KafkaBroker, free_port


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


_next_id = iter(range(1, 10**9))


def envelope(
    queue: str,
    *,
    priority: int = 1,
    body: str = '{"n": 1}',
    key: str | None = None,
    serial_group: str | None = None,
    headers: dict[str, str] | None = None,
    type: str = "thing.happened",
    effect_key: str | None = None,
    sequence_key: str | None = None,
    sequence: int | None = None,
    schema_version: str | None = None,
) -> Envelope:
    return Envelope(
        event_id=uuid.uuid4(),
        type=type,
        queue=queue,
        priority=priority,
        outbox_id=next(_next_id),
        occurred_at=datetime(2026, 11, 29, 12, 30, 1, 250000, tzinfo=UTC),
        body=body,
        serial_group=serial_group,
        key=key,
        headers=headers or {},
        effect_key=effect_key,
        sequence_key=sequence_key,
        sequence=sequence,
        schema_version=schema_version,
    )


def outgoing(envelopes: list[Envelope]) -> list[Outgoing]:
    return [Outgoing(row_id=e.outbox_id, envelope=e) for e in envelopes]


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    key: str | None = None


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# -- a TCP proxy the test can cut ---------------------------------------------------------------


@dataclass
class TcpProxy:
    """Forwards 127.0.0.1:``port`` to the target; ``cut()`` drops every connection and stops
    listening (the broker looks dead), ``restore()`` listens again on the same port."""

    target: tuple[str, int]
    port: int = field(default_factory=free_port)
    _listener: socket.socket | None = None
    _sockets: list[socket.socket] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            # The 5 s were for connecting. Left on the socket, a broker quiet for 5 s (an idle
            # relay between heartbeats) made recv() time out and the pump drop the connection.
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown() first: a bare close() leaves the port listening while the accept
            # thread is blocked in accept() on it (Linux).
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        self.start()


# -- a TCP proxy the test can also stall ------------------------------------------------------


@dataclass
class StallingProxy(TcpProxy):
    """``TcpProxy`` (``cut()``: every connection dropped, the port closed, the broker looks
    dead; ``restore()``) that can also ``stall()``: stop forwarding the broker's bytes to the
    clients while still taking what they send (messages get stored, their confirms are held
    back), until ``resume()``."""

    _flowing: threading.Event = field(default_factory=threading.Event)
    _held_since: float | None = None  # monotonic time the stall first held broker bytes

    def start(self) -> StallingProxy:
        self._flowing.set()
        super().start()
        return self

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:  # type: ignore[override]
        try:
            from_broker = src.getpeername() == self.target
            while data := src.recv(65536):
                if from_broker and not self._flowing.is_set():
                    if self._held_since is None:
                        self._held_since = time.monotonic()
                    self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def stall(self) -> None:
        self._held_since = None
        self._flowing.clear()

    def held_for(self) -> float:
        """Seconds since the stall held back the first bytes of the broker (0: none yet)."""
        since = self._held_since
        return 0.0 if since is None else time.monotonic() - since

    def resume(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        super().cut()
        self._flowing.set()  # held pumps wake up, find their sockets closed and end


@dataclass
class Refusal:
    publisher: Publisher
    bad: Envelope
    good: Envelope
    read_good: Callable[[], list[Received]]


# -- the cases ----------------------------------------------------------------------------------


class BrokerCase:
    """What the contract suite needs from one broker + publisher."""

    name = "?"
    confirm_timeout = 3.0

    def publisher(self, **options: Any) -> Publisher:
        raise NotImplementedError

    def read(self, destination: str, count: int, timeout: float = 15.0) -> list[Received]:
        raise NotImplementedError

    def refusal(self, queue: str) -> Refusal:
        """A publisher, a message its broker refuses and one it accepts."""
        raise NotImplementedError

    @contextlib.contextmanager
    def outage(self) -> Iterator[tuple[Publisher, Callable[[], None], Callable[[], None]]]:
        """(publisher through a path the test can break, cut(), restore())."""
        raise NotImplementedError
        yield  # pragma: no cover

    def closed_port(self) -> Publisher:
        raise NotImplementedError

    def cleanup(self) -> None:
        """Remove what the test declared on the shared broker."""


class KafkaCase(BrokerCase):
    name = "kafka"

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.request = request
        self.tmp_path = tmp_path
        self.broker: KafkaBroker = request.getfixturevalue("kafka_broker")

    def publisher(self, **options: Any) -> Publisher:
        from relay.publishers.kafka import KafkaPublisher

        options.setdefault("confirm_timeout", self.confirm_timeout)
        return KafkaPublisher(self.broker.bootstrap, **options)

    def read(self, destination: str, count: int, timeout: float = 15.0) -> list[Received]:
        return [
            Received(h, b, k)
            for h, b, k in read_kafka(self.broker.bootstrap, destination, count, timeout)
        ]

    def refusal(self, queue: str) -> Refusal:
        # The client enforces the cluster's message.max.bytes before sending, as a real
        # Kafka deployment does (the broker's own limit is the same setting). A refusal by
        # the broker itself is in test_kafka_publisher.py (schema validation).
        publisher = self.publisher(config={"message.max.bytes": 10_000})
        good = envelope(queue, body='"small"')
        return Refusal(
            publisher,
            envelope(queue, body='"' + "x" * 20_000 + '"'),
            good,
            lambda: self.read(good.queue + "_1", 1),
        )

    @contextlib.contextmanager
    def outage(self) -> Iterator[tuple[Publisher, Callable[[], None], Callable[[], None]]]:
        broker = KafkaBroker(log_path=self.tmp_path / "tansu-outage.log")
        broker.start()
        try:
            from relay.publishers.kafka import KafkaPublisher

            publisher = KafkaPublisher(broker.bootstrap, confirm_timeout=self.confirm_timeout)
            yield publisher, broker.kill, broker.start
        finally:
            broker.stop()

    def closed_port(self) -> Publisher:
        from relay.publishers.kafka import KafkaPublisher

        return KafkaPublisher(f"127.0.0.1:{free_port()}", confirm_timeout=self.confirm_timeout)


class RabbitMQCase(BrokerCase):
    name = "rabbitmq"

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.url = services.RABBITMQ_URL
        if not services.port_open("127.0.0.1", 5672):
            services.missing("rabbitmq", "127.0.0.1:5672 closed")
        self.declared: list[str] = []
        self.exchanges: list[str] = []

    def _module(self) -> Any:
        from relay.publishers import rabbitmq

        return rabbitmq

    def publisher(self, **options: Any) -> Publisher:
        options.setdefault("confirm_timeout", self.confirm_timeout)
        publisher: Publisher = self._module().RabbitMQPublisher(self.url, **options)
        return publisher

    def read(self, destination: str, count: int, timeout: float = 15.0) -> list[Received]:
        self.declared.append(destination)
        return [Received(h, b) for h, b in read_rabbitmq(self.url, destination, count, timeout)]

    def refusal(self, queue: str) -> Refusal:
        # Fan-out mode: no queue is bound to the bad message's exchange, so it is unroutable
        # and returned (mandatory=True); the good one's exchange has a queue bound.
        bad, good = envelope(queue), envelope(queue + "-bound")
        bad_exchange, good_exchange = f"{bad.queue}_1", f"{good.queue}_1"
        reader = good_exchange + ".reader"
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(self.url))) as conn:
            channel = conn.channel()
            for name in (bad_exchange, good_exchange):
                channel.exchange_declare(name, exchange_type="fanout", durable=True)
            channel.queue_declare(reader, durable=True)
            channel.queue_bind(reader, good_exchange)
        self.exchanges += [bad_exchange, good_exchange]
        return Refusal(self.publisher(fanout=True), bad, good, lambda: self.read(reader, 1))

    @contextlib.contextmanager
    def outage(self) -> Iterator[tuple[Publisher, Callable[[], None], Callable[[], None]]]:
        proxy = TcpProxy(("127.0.0.1", 5672)).start()
        try:
            url = self.url.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}")
            yield (
                self._module().RabbitMQPublisher(url, confirm_timeout=self.confirm_timeout),
                proxy.cut,
                proxy.restore,
            )
        finally:
            proxy.cut()

    def closed_port(self) -> Publisher:
        url = self.url.replace("127.0.0.1:5672", f"127.0.0.1:{free_port()}")
        publisher: Publisher = self._module().RabbitMQPublisher(
            url, confirm_timeout=self.confirm_timeout
        )
        return publisher

    def cleanup(self) -> None:
        if not (self.declared or self.exchanges):
            return
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(self.url))) as conn:
            channel = conn.channel()
            for name in self.declared:
                channel.queue_delete(name)
            for name in self.exchanges:
                channel.exchange_delete(name)


# The contract runs once per entry: adding a publisher is one line.
CASES: dict[str, Callable[[pytest.FixtureRequest, Path], BrokerCase]] = {
    "kafka": KafkaCase,
    "rabbitmq": RabbitMQCase,
}


# -- plain clients, the way a consumer in another service would read --------------------------


def read_kafka(
    bootstrap: str, topic: str, count: int, timeout: float = 15.0
) -> list[tuple[dict[str, str], bytes, str | None]]:
    """Every message of ``topic`` from the beginning (all partitions, no consumer group),
    waiting until ``count`` arrived or ``timeout``; per-partition order is kept."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader-"),
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])  # -2: beginning
        out: list[tuple[dict[str, str], bytes, str | None]] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            out.append(_kafka_record(message))
        # anything beyond ``count`` would be a duplicate: look a little longer for it
        extra_deadline = time.monotonic() + 0.5
        while time.monotonic() < extra_deadline:
            message = consumer.poll(0.1)
            if message is not None and not message.error():
                out.append(_kafka_record(message))
        return out
    finally:
        consumer.close()


def kafka_headers(message: Message) -> dict[str, str]:
    raw = message.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return {k: _text(v) for k, v in pairs if v is not None}


def _kafka_record(message: Message) -> tuple[dict[str, str], bytes, str | None]:
    key = message.key()
    return kafka_headers(message), message.value() or b"", None if key is None else _text(key)


def read_rabbitmq(
    url: str, queue: str, count: int, timeout: float = 15.0
) -> list[tuple[dict[str, str], bytes]]:
    out: list[tuple[dict[str, str], bytes]] = []
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as conn:
        channel = conn.channel()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                if len(out) >= count:
                    break
                time.sleep(0.05)
                continue
            headers = {k: _text(v) for k, v in (properties.headers or {}).items()}
            out.append((headers, body))
    return out


def kafka_schema_broker(tmp_path: Path, schemas: dict[str, str]) -> KafkaBroker:
    """A tansu broker that validates the JSON values of some topics (``{topic: schema}``):
    the way to make a Kafka-protocol broker itself refuse a record."""
    schema_dir = tmp_path / "schema"
    schema_dir.mkdir(exist_ok=True)
    for topic, schema in schemas.items():
        (schema_dir / f"{topic}.json").write_text(schema)
    broker = KafkaBroker(log_path=tmp_path / "tansu-schema.log")
    # tansu resolves ``file://`` against its working directory; it reads SCHEMA_REGISTRY.
    previous, here = os.environ.get("SCHEMA_REGISTRY"), os.getcwd()
    os.environ["SCHEMA_REGISTRY"] = "file://./schema"
    os.chdir(tmp_path)
    try:
        broker.start()
    finally:
        os.chdir(here)
        if previous is None:
            del os.environ["SCHEMA_REGISTRY"]
        else:
            os.environ["SCHEMA_REGISTRY"] = previous
    return broker
