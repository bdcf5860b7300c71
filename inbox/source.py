"""How messages enter the inbox: the interface between broker sources and the worker.

A source (RabbitMQ, Kafka, or the database itself) only *receives*: it hands messages to an
``Ingest`` callable, which makes their inbox rows durable (one transaction, duplicates
absorbed without an error) and returns after the commit. Only then does the source ack the
broker / commit its offsets. Processing (group lock, claim, handler) always runs off the inbox
table, whatever the source.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from outbox.wire import Envelope


@dataclass(frozen=True)
class Rejected:
    """A broker message that is not in our wire format. It is kept (inbox row ``failed`` with
    the reason), never silently dropped; ``event_id`` is taken from the headers when it
    parses, else derived from the raw bytes so a redelivery stays one row."""

    reason: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    origin: str = ""  # e.g. "rabbitmq:orders_1" / "kafka:orders_1[2]@1234"


class Ingest(Protocol):
    def __call__(self, messages: Sequence[Envelope | Rejected]) -> None:
        """Make these inbox rows durable (commit); duplicates are counted, not raised."""


class Source(Protocol):
    def run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        """Receive up to ``max_messages`` (waiting at most ``timeout`` s for the first),
        pass them to ``ingest``, then ack/commit them at the broker. Returns how many."""

    def close(self) -> None:
        """Stop consuming; unacked messages go back to the broker. Idempotent."""


class ThreadSafeSource:
    """``run_once``/``close`` for broker sources whose client is not thread-safe.

    ``run_once`` runs in the worker's source thread; ``close`` may come from another thread
    (SIGTERM): it shuts the client down at once if idle, else ``run_once`` does as it returns.
    Subclasses implement ``_run_once`` and ``_shutdown``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = False

    def _run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    def run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        with self._lock:
            try:
                if self._closing:
                    return 0
                return self._run_once(ingest, max_messages, timeout)
            finally:
                if self._closing:
                    self._shutdown()

    def close(self) -> None:
        self._closing = True
        if self._lock.acquire(blocking=False):
            try:
                self._shutdown()
            finally:
                self._lock.release()
        # else: run_once is running in another thread and closes as it returns
