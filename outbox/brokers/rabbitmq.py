"""RabbitMQ through pika, for the relay's publisher and the inbox's source.

What both directions share: connection settings from the URL, declaring the durable queues
``<queue>_<priority>`` (or the fan-out exchanges of that name and the consumer groups' queues
bound to them), pika's errors and how they read in logs (masked), and the two places where
pika's public API falls short (``async_channel``, ``abandon``).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from typing import Any

import pika
import pika.channel
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from outbox.dsn import mask

log = logging.getLogger(__name__)

# What a lost connection, a closed channel or a refused frame raises.
ERRORS: tuple[type[BaseException], ...] = (pika.exceptions.AMQPError, OSError)


def connect(
    url: str, *, connection_attempts: int = 1, timeout: float | None = None
) -> pika.BlockingConnection:
    """Open a connection. ``timeout`` bounds a blocked connection (RabbitMQ out of memory
    or disk) and, up to 10 s, the TCP connect; without it pika's defaults apply."""
    params = pika.URLParameters(url)
    params.connection_attempts = connection_attempts
    if timeout is not None:
        params.blocked_connection_timeout = timeout
        params.socket_timeout = min(10.0, timeout)
    return pika.BlockingConnection(params)


def close(connection: pika.BlockingConnection | None, url: str) -> None:
    """Close ``connection`` if it is open; a dead socket has nothing left to release."""
    if connection is not None and connection.is_open:
        try:
            connection.close()
        except Exception as exc:
            log.debug("closing %s: %s", mask(url), exc)


def describe(exc: object) -> str:
    """``Type: text`` of a client error, masked: pika puts URLs and hosts in its texts."""
    text = str(exc) or type(exc).__name__
    return mask(f"{type(exc).__name__}: {text}")


# -- declaring ---------------------------------------------------------------------------------


def declare_queue(
    channel: BlockingChannel | pika.channel.Channel,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    callback: Callable[[Any], None] | None = None,
) -> None:
    """Durable, with ``arguments`` (e.g. ``{"x-queue-type": "quorum"}``): the relay and the
    consumers must declare a queue alike, or RabbitMQ refuses the second (406). ``callback``:
    on the asynchronous channel, called with the answer (the call itself does not wait)."""
    extra = {} if callback is None else {"callback": callback}
    channel.queue_declare(
        queue=name, durable=True, arguments=dict(arguments) if arguments else None, **extra
    )


def declare_exchange(
    channel: BlockingChannel | pika.channel.Channel,
    name: str,
    *,
    callback: Callable[[Any], None] | None = None,
) -> None:
    """The durable fan-out exchange a fan-out publisher sends ``name``'s messages to."""
    extra = {} if callback is None else {"callback": callback}
    channel.exchange_declare(exchange=name, exchange_type="fanout", durable=True, **extra)


def group_queue(destination: str, group: str) -> str:
    """The queue of consumer group ``group`` on the fan-out exchange ``destination``."""
    return f"{destination}.{group}"


def exchange_of(group_queue_name: str) -> str:
    """The fan-out exchange a ``group_queue`` is bound to."""
    return group_queue_name.rsplit(".", 1)[0]


# -- below pika's public API -------------------------------------------------------------------


def async_channel(channel: BlockingChannel) -> pika.channel.Channel:
    """The asynchronous channel under pika's blocking one.

    The blocking channel in confirm mode waits for each message's confirm inside
    ``basic_publish`` (a round trip per message), and without confirm mode it writes the
    socket once per message. The channel under it buffers ``basic_publish`` frames and
    reports acks, nacks, returns and its close by callback, in frame order: a batch is
    written at once and its confirms collected after. pika offers no public way to it.
    """
    impl: pika.channel.Channel = channel._impl
    return impl


def abandon(connection: pika.BlockingConnection, url: str) -> None:
    """Drop a connection whose broker stopped answering.

    ``close()`` sends Connection.Close and waits, with no time limit, for a Close-Ok a silent
    broker never sends. Shutting the socket down makes pika handle it as a lost connection
    (and release its resources) at once; pika has no public call that does this.
    """
    try:
        connection._impl._transport._sock.shutdown(socket.SHUT_RDWR)
        connection.process_data_events(0)
    except Exception as exc:  # the expected StreamLostError, or already gone
        log.debug("abandoning %s: %s", mask(url), exc)
