"""RabbitMQ source: consumes ``<queue>_<priority>``, the most urgent priority first.

- One consumer per queue on one channel, with ``basic_qos(prefetch)`` per consumer: every
  priority has its own window, so a full window of less urgent messages never keeps an
  urgent one from being delivered.
- Deliveries wait in a local buffer per priority. ``run_once`` takes from the most urgent
  buffer that has messages; before it settles for a less urgent one it asks the broker
  (passive declare) whether a more urgent queue has ready messages, and if so waits for them
  (up to the call's timeout). So priority 1 is drained before priority 2 is looked at.
- Messages are acked after ``ingest`` returned (the inbox rows are committed);
  if ingest raises they are nacked with requeue, so they come back. Malformed messages are
  handed to ingest as ``Rejected`` (stored ``failed`` with the reason) and then acked: kept,
  never requeued in a loop.
- Queues are declared durable with the same ``queue_arguments`` as the relay's publisher
  (both through ``outbox.brokers.rabbitmq``); without arguments of its own, the source
  consumes a queue the relay declared with arguments as it is. With ``fanout_group`` the
  source declares its own durable queue ``<queue>_<priority>.<group>`` bound to the
  publisher's fan-out exchange.

``close()`` may be called from another thread while ``run_once`` runs (the worker does): the
pika connection is not thread-safe, so the close is then done by ``run_once`` as it returns.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pika
import pika.exceptions

from inbox.sources.thread_safe import ThreadSafeSource
from outbox.brokers import rabbitmq as broker
from outbox.brokers.rabbitmq import ERRORS, describe
from outbox.dsn import mask
from outbox.transport import BrokerUnavailable, Ingest, Rejected
from outbox.wire import Envelope, MalformedMessageError, from_wire, routing_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Delivery:
    tag: int
    queue: str
    properties: pika.BasicProperties
    body: bytes


class RabbitMQSource(ThreadSafeSource):
    def __init__(
        self,
        url: str,
        queues: Sequence[str],
        priorities: Sequence[int],
        *,
        prefetch: int = 100,
        queue_arguments: Mapping[str, Any] | None = None,
        fanout_group: str | None = None,
        connection_attempts: int = 1,
    ) -> None:
        super().__init__(queues, priorities)
        if prefetch < 1:
            raise ValueError(f"prefetch: must be at least 1, not {prefetch}")
        self.url = url
        self.prefetch = prefetch
        self.queue_arguments = dict(queue_arguments or {})
        self.fanout_group = fanout_group
        self.connection_attempts = connection_attempts
        # (priority, broker queue name), most urgent first
        self._queues = [
            (p, self._queue_name(routing_name(q, p))) for p in self.priorities for q in queues
        ]
        self._buffers: dict[int, deque[_Delivery]] = {p: deque() for p in self.priorities}
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None

    def __repr__(self) -> str:
        return f"RabbitMQSource({mask(self.url)!r}, {[q for _, q in self._queues]})"

    def _queue_name(self, destination: str) -> str:
        return (
            broker.group_queue(destination, self.fanout_group) if self.fanout_group else destination
        )

    # -- Source -------------------------------------------------------------------------------

    def drained(self) -> bool:
        """True when nothing is buffered here and no queue has ready messages at the broker
        (asked now). Meant for "stop when idle"; called from the thread that runs run_once."""
        with self._lock:
            if self._connection is None or self._channel is None:
                return False
            try:
                self._connection.process_data_events(0)
                ready = any(
                    self._channel.queue_declare(name, passive=True).method.message_count > 0
                    for _, name in self._queues
                )
                # deliveries pushed before the answers are dispatched by now (frame order)
                self._connection.process_data_events(0)
                return not ready and not any(self._buffers.values())
            except ERRORS:
                self._drop()
                return False

    # -- internals ----------------------------------------------------------------------------

    def _run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        try:
            if self._connection is None:
                self._connect()
            assert self._connection is not None
            self._connection.process_data_events(0)
            priority = self._wait_for_most_urgent(deadline)
            if priority is None:
                return 0
            buffer = self._buffers[priority]
            taken = [buffer.popleft() for _ in range(min(max_messages, len(buffer)))]
        except ERRORS as exc:
            self._drop()
            raise BrokerUnavailable(f"RabbitMQ {mask(self.url)}: {describe(exc)}") from exc

        messages = [_parse(d) for d in taken]
        try:
            ingest(messages)
        except BaseException:
            self._settle(taken, ack=False)
            raise
        self._settle(taken, ack=True)
        return len(taken)

    def _wait_for_most_urgent(self, deadline: float) -> int | None:
        """The priority to take from now, waiting (until ``deadline``) for messages that a
        more urgent queue holds at the broker but has not delivered yet."""
        assert self._connection is not None
        while True:
            buffered = self._most_urgent_buffered()
            remaining = deadline - time.monotonic()
            if buffered is not None:
                if remaining <= 0:
                    return buffered
                ready = self._more_urgent_ready(buffered)
                # A delivery the broker pushed before answering is on the wire ahead of the
                # answer (same channel, in order): dispatch it before deciding.
                self._connection.process_data_events(0)
                if self._most_urgent_buffered() == buffered and not ready:
                    return buffered
                if self._most_urgent_buffered() != buffered:
                    continue
            elif remaining <= 0 or self._closing:
                return None
            self._connection.process_data_events(time_limit=min(remaining, 0.05))

    def _most_urgent_buffered(self) -> int | None:
        return next((p for p in self.priorities if self._buffers[p]), None)

    def _more_urgent_ready(self, priority: int) -> bool:
        for p, name in self._queues:
            if p >= priority:
                break
            declared = self._channel.queue_declare(name, passive=True)
            if declared.method.message_count > 0:
                return True
        return False

    def _settle(self, taken: Sequence[_Delivery], *, ack: bool) -> None:
        try:
            highest = max((d.tag for d in taken), default=0)
            others = min((d.tag for b in self._buffers.values() for d in b), default=highest + 1)
            if ack and taken and others > highest:
                # Every unacked delivery up to ``highest`` is in this batch: one frame for all.
                self._channel.basic_ack(highest, multiple=True)
                return
            for delivery in taken:
                if ack:
                    self._channel.basic_ack(delivery.tag)
                else:
                    self._channel.basic_nack(delivery.tag, requeue=True)
        except ERRORS as exc:
            # The broker requeues what was not acked when the connection dies: those
            # messages come back and the inbox counts them as duplicates.
            self._drop()
            raise BrokerUnavailable(
                f"RabbitMQ {mask(self.url)}: {'ack' if ack else 'nack'} failed: {describe(exc)}"
            ) from exc

    def _connect(self) -> None:
        self._connection = broker.connect(self.url, connection_attempts=self.connection_attempts)
        channel = self._connection.channel()
        for _, name in self._queues:
            channel = self._declare(channel, name)
        channel.basic_qos(prefetch_count=self.prefetch)  # per consumer (global_qos=False)
        for priority, name in self._queues:
            channel.basic_consume(
                name, on_message_callback=partial(self._on_message, priority, name)
            )
        self._channel = channel
        log.info("consuming %s", ", ".join(name for _, name in self._queues))

    def _declare(self, channel: Any, name: str) -> Any:
        """Declare ``name`` durable; returns the channel to go on with.

        Without ``queue_arguments`` of our own, a queue the relay already declared with other
        arguments (x-queue-type, limits ...) is consumed as it is: RabbitMQ refuses the
        declaration (406, which closes the channel), so we check it exists on a new channel.
        With explicit ``queue_arguments`` the mismatch is an error.
        """
        if self.fanout_group:
            broker.declare_exchange(channel, broker.exchange_of(name))
        try:
            broker.declare_queue(channel, name, self.queue_arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 406 or self.queue_arguments:
                raise
            assert self._connection is not None
            channel = self._connection.channel()
            channel.queue_declare(name, passive=True)
            log.info("queue %s exists with its own arguments; consuming it as it is", name)
        if self.fanout_group:
            channel.queue_bind(name, broker.exchange_of(name))
        return channel

    def _on_message(
        self,
        priority: int,
        queue: str,
        _channel: Any,
        method: Any,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self._buffers[priority].append(_Delivery(method.delivery_tag, queue, properties, body))

    def _drop(self) -> None:
        """Forget the connection and the buffered deliveries (the broker requeues them)."""
        connection, self._connection, self._channel = self._connection, None, None
        for buffer in self._buffers.values():
            buffer.clear()
        broker.close(connection, self.url)

    def _shutdown(self) -> None:
        self._drop()


def _parse(delivery: _Delivery) -> Envelope | Rejected:
    headers = delivery.properties.headers
    try:
        return from_wire(headers, delivery.body)
    except MalformedMessageError as exc:
        return Rejected(
            reason=str(exc),
            headers={str(k): _lenient_text(v) for k, v in (headers or {}).items()},
            body=delivery.body,
            origin=f"rabbitmq:{delivery.queue}",
        )


def _lenient_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
