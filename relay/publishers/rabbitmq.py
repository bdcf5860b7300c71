"""RabbitMQ publisher: pika, publisher confirms waited for once per batch.

pika's ``BlockingChannel.confirm_delivery()`` makes every ``basic_publish`` wait for its own
confirm: one network round trip per message. Instead we switch the asynchronous channel under
it (``outbox.brokers.rabbitmq.async_channel``) into confirm mode with our own ack/nack and
return callbacks, publish the whole batch, and then run ``process_data_events`` until every
delivery tag is settled. The broker sends a ``basic.return`` (unroutable, ``mandatory=True``)
before the ack of the same message, and the callbacks run in frame order, so a returned
message is known to be refused when its ack comes.

Mapping of outcomes (the Publisher contract of outbox.transport):
- ack                                  -> confirmed
- basic.return then ack (unroutable)   -> refused, with the reply text
- nack (e.g. queue full, reject-publish) -> refused
- body over the broker's max size      -> refused (the limit is learnt from the broker's
  channel error, then checked before sending, so one oversized row never blocks a batch twice)
- connection lost, channel closed, confirm timeout -> ``BrokerUnavailable``
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pika
import pika.exceptions
import pika.spec

from outbox.brokers import rabbitmq as broker
from outbox.brokers.rabbitmq import ERRORS, describe
from outbox.dsn import mask
from outbox.transport import BrokerUnavailable, Outgoing
from outbox.wire import CONTENT_TYPE
from relay.publishers.settings import PublisherSettings

log = logging.getLogger(__name__)

# RabbitMQ's channel error for an oversized body: "message size 200 is larger than
# configured max size 100".
_SIZE_ERROR = re.compile(r"message size (\d+) is larger than configured max size (\d+)")
PERSISTENT = 2


class RabbitMQPublisher:
    """Publishes to durable queues ``<queue>_<priority>`` (or fan-out exchanges of that name).

    ``queue_arguments``: passed to ``queue_declare`` (e.g. ``{"x-queue-type": "quorum"}``); the
    consumers must declare the same. ``fanout``: publish to a durable fan-out exchange per
    destination instead of a queue, so several consumer services bind queues of their own; a
    message no queue is bound to is returned (refused). ``max_message_bytes``: refuse bodies
    above this before sending (learnt from the broker when it rejects one). The defaults and
    ``confirm_timeout``: ``relay.publishers.settings.PublisherSettings``.
    """

    def __init__(
        self,
        url: str,
        *,
        queue_arguments: Mapping[str, Any] | None = None,
        fanout: bool = PublisherSettings.fanout,
        confirm_timeout: float = PublisherSettings.confirm_timeout,
        max_message_bytes: int | None = None,
        connection_attempts: int = 1,
    ) -> None:
        self.url = url
        self.queue_arguments = dict(queue_arguments or {})
        self.fanout = fanout
        self.confirm_timeout = confirm_timeout
        self.max_message_bytes = max_message_bytes
        self.connection_attempts = connection_attempts
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._async: Any = None  # the channel under self._channel: publishes and confirms
        self._closed_reason: Exception | None = None
        self._declared: set[str] = set()
        # Per-batch confirm state, filled by the callbacks.
        self._next_tag = 0
        self._tags: dict[int, int] = {}
        self._by_message_id: dict[str, int] = {}
        self._result: dict[int, str | None] = {}
        self._returned: dict[int, str] = {}

    def __repr__(self) -> str:
        return f"RabbitMQPublisher({mask(self.url)!r}, fanout={self.fanout})"

    # -- connection ---------------------------------------------------------------------------

    def connect(self) -> None:
        self.close()
        try:
            self._connection = broker.connect(
                self.url,
                connection_attempts=self.connection_attempts,
                timeout=self.confirm_timeout,
            )
            self._open_channel()
        except ERRORS as exc:
            self.close()
            raise BrokerUnavailable(f"cannot connect to {mask(self.url)}: {describe(exc)}") from exc

    def _open_channel(self) -> None:
        assert self._connection is not None
        channel = self._connection.channel()
        impl = broker.async_channel(channel)
        selected: list[bool] = []

        def on_selected(_frame: Any) -> None:
            selected.append(True)
            self._wake()

        self._closed_reason = None
        impl.add_on_close_callback(self._on_channel_closed)
        impl.add_on_return_callback(self._on_return)
        impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=on_selected)
        self._pump(channel, lambda: bool(selected), self.confirm_timeout, "confirm.select")
        self._channel, self._async = channel, impl
        self._next_tag = 0
        self._declared.clear()

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        self._async = None
        broker.close(connection, self.url)

    def idle(self) -> None:
        """Serve heartbeats while the relay has nothing to publish."""
        if self._connection is not None and self._connection.is_open:
            try:
                self._connection.process_data_events(0)
            except ERRORS as exc:
                log.warning("broker connection lost while idle: %s", describe(exc))
                self.close()

    # -- publishing ---------------------------------------------------------------------------

    def publish(self, batch: Sequence[Outgoing]) -> Mapping[int, str | None]:
        if not batch:
            return {}
        if self._connection is None or not self._connection.is_open or self._channel is None:
            self.connect()
        self._result = {}
        self._returned = {}
        self._tags = {}
        self._by_message_id = {}
        try:
            refused = self._declare_all({item.destination for item in batch})
            for item in batch:
                if item.destination in refused:
                    self._result[item.row_id] = refused[item.destination]
                    continue
                self._publish_one(item)
            self._pump(
                self._channel,
                lambda: len(self._tags) == 0,
                self.confirm_timeout,
                f"{len(batch)} confirms",
            )
        except BrokerUnavailable:
            self.close()
            raise
        except ERRORS as exc:
            self._learn_size_limit(exc)
            self.close()
            raise BrokerUnavailable(f"publish to {mask(self.url)} failed: {describe(exc)}") from exc
        return {item.row_id: self._result.get(item.row_id, "no confirm") for item in batch}

    def _publish_one(self, item: Outgoing) -> None:
        body = item.envelope.wire_body()
        if self.max_message_bytes is not None and len(body) > self.max_message_bytes:
            self._result[item.row_id] = (
                f"message body is {len(body)} bytes; the broker's limit is {self.max_message_bytes}"
            )
            return
        destination = item.destination
        self._declare(destination)
        properties = pika.BasicProperties(
            content_type=CONTENT_TYPE,
            delivery_mode=PERSISTENT,
            message_id=str(item.envelope.event_id),
            headers=item.envelope.wire_headers(),
            priority=None,
        )
        exchange, routing_key = (destination, "") if self.fanout else ("", destination)
        self._next_tag += 1
        self._tags[self._next_tag] = item.row_id
        self._by_message_id[str(item.envelope.event_id)] = item.row_id
        # Only buffered: _pump() writes the whole batch and reads the confirms.
        self._async.basic_publish(
            exchange=exchange,
            routing_key=routing_key,
            body=body,
            properties=properties,
            mandatory=True,
        )

    def _declare_all(self, destinations: set[str]) -> dict[str, str]:
        """Declare each destination; those the broker will never take (reserved ``amq.``
        prefix: 403; over 255 bytes: refused by the client before sending) are refusals of
        their rows, not an outage that would stall every other row."""
        refused: dict[str, str] = {}
        for destination in sorted(destinations):
            try:
                self._declare(destination)
            except pika.exceptions.ShortStringTooLong:
                refused[destination] = "destination name is over AMQP's 255 bytes"
            except _ChannelClosed as exc:
                reason = exc.reason
                if not (
                    isinstance(reason, pika.exceptions.ChannelClosedByBroker)
                    and reason.reply_code == 403
                ):
                    raise
                refused[destination] = (
                    f"destination refused: {reason.reply_code} {reason.reply_text}"
                )
                # The broker closed the channel (nothing was published on it yet): a new one.
                self._channel = None
                self._open_channel()
        return refused

    def _declare(self, destination: str) -> None:
        """Declare on the asynchronous channel and wait at most the confirm timeout.

        The blocking channel's declare waits for its answer without a time limit: a relay
        that reconnected after an outage and then met a silent broker on its first declare
        hung there (tests/faults/test_confirm_stall.py), holding its batch's row locks."""
        if destination in self._declared:
            return
        answered: list[bool] = []

        def on_ok(_frame: Any) -> None:
            answered.append(True)
            self._wake()

        if self.fanout:
            broker.declare_exchange(self._async, destination, callback=on_ok)
        else:
            broker.declare_queue(self._async, destination, self.queue_arguments, callback=on_ok)
        self._pump(
            self._channel, lambda: bool(answered), self.confirm_timeout, f"declaring {destination}"
        )
        self._declared.add(destination)

    # -- callbacks (run inside process_data_events, in frame order) ---------------------------

    def _on_return(
        self, _channel: Any, method: Any, properties: pika.BasicProperties, _body: bytes
    ) -> None:
        row_id = self._by_message_id.get(properties.message_id or "")
        if row_id is not None:
            self._returned[row_id] = (
                f"unroutable: {method.reply_code} {method.reply_text} "
                f"(exchange={method.exchange!r}, routing_key={method.routing_key!r})"
            )

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        nack = isinstance(method, pika.spec.Basic.Nack)
        tags = (
            [t for t in self._tags if t <= method.delivery_tag]
            if method.multiple
            else [method.delivery_tag]
        )
        for tag in tags:
            row_id = self._tags.pop(tag, None)
            if row_id is None:
                continue
            if nack:
                self._result[row_id] = "nacked by the broker (queue full or internal error)"
            else:
                self._result[row_id] = self._returned.pop(row_id, None)
        if not self._tags:
            self._wake()

    def _on_channel_closed(self, _channel: Any, reason: Exception) -> None:
        self._closed_reason = reason

    def _wake(self) -> None:
        """End the running ``process_data_events`` now: callbacks of the asynchronous
        channel do not, so it would otherwise wait out its whole time limit. A timer due at
        once is an event of the blocking layer, which ends it."""
        if self._connection is not None and self._connection.is_open:
            self._connection.call_later(0, _nothing)

    # -- helpers ------------------------------------------------------------------------------

    def _pump(self, channel: Any, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Process broker frames until ``done()``, the channel closes or ``timeout``.

        The deadline is a time limit of ``process_data_events``, so it fires even when the
        broker sends nothing at all (tests/faults/test_confirm_stall.py: a broker that stopped
        answering once held the relay forever). A channel the broker closes ends the wait too.
        """
        connection = self._connection
        assert connection is not None
        deadline = time.monotonic() + timeout
        while not done() and channel.is_open:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            connection.process_data_events(time_limit=remaining)
        if channel.is_closed:
            reason = self._closed_reason
            self._learn_size_limit(reason)
            raise _ChannelClosed(reason)
        if not done():
            self._abandon()
            raise BrokerUnavailable(f"no answer from {mask(self.url)} for {what} in {timeout}s")

    def _abandon(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        self._async = None
        if connection is not None:
            broker.abandon(connection, self.url)

    def _learn_size_limit(self, exc: object) -> None:
        match = _SIZE_ERROR.search(str(exc))
        if match:
            limit = int(match.group(2))
            log.warning("the broker refuses bodies over %d bytes; checking before sending", limit)
            self.max_message_bytes = limit


class _ChannelClosed(BrokerUnavailable):
    """The broker closed the channel; ``reason`` is pika's exception saying why."""

    def __init__(self, reason: Exception | None) -> None:
        super().__init__(f"channel closed by the broker: {describe(reason)}")
        self.reason = reason


def _nothing() -> None:
    return None
