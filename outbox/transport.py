"""The two interfaces between the database and a broker, and what crosses them.

``Publisher`` is the relay's side (committed outbox rows out to RabbitMQ or Kafka);
``Source`` is the consumer's side (broker messages, or outbox rows, into the inbox). They
live in the core so that relay/ and inbox/ implement them without importing each other, and
so that ``outbox.testing`` can offer in-memory versions of both.

Publisher contract (tests/integration/relay/test_publisher_contract.py checks it on every
publisher):

- ``publish(batch)`` sends every message of the batch, then waits for the broker's verdict
  on each (publisher confirms / delivery reports), and returns ``{row_id: None}`` for a
  confirmed message or ``{row_id: "reason"}`` for one the broker refused (unroutable, too
  large, ...). Every row id of the batch is in the result.
- When the outcome of the batch is not known (broker unreachable, connection lost, confirm
  timeout), it raises ``BrokerUnavailable``: the relay rolls the batch back without counting
  attempts and reconnects with backoff. Some messages may have reached the broker: that is the
  at-least-once duplicate the inbox absorbs.
- It is called from one thread. ``close()`` is idempotent. ``connect()`` may be called again
  after ``BrokerUnavailable`` to reconnect.

Source contract: a source only *receives*. It hands messages to an ``Ingest`` callable, which
makes their inbox rows durable (one transaction, duplicates absorbed without an error) and
returns after the commit; only then does the source ack the broker / commit its offsets.
Processing (group lock, claim, handler) always runs off the inbox table, whatever the source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from outbox.errors import OutboxError
from outbox.wire import Envelope, routing_name


class BrokerUnavailable(OutboxError):
    """The broker could not be reached or did not answer in time; nothing is decided."""


@dataclass(frozen=True)
class Outgoing:
    """One outbox row on its way out."""

    row_id: int
    envelope: Envelope

    @property
    def destination(self) -> str:
        """``<queue>_<priority>``: the RabbitMQ queue or Kafka topic."""
        return routing_name(self.envelope.queue, self.envelope.priority)

    @property
    def partition_key(self) -> str | None:
        return self.envelope.key


class Publisher(Protocol):
    def connect(self) -> None:
        """Open the connection (and declare queues/topics lazily as they are first used)."""

    def publish(self, batch: Sequence[Outgoing]) -> Mapping[int, str | None]:
        """Publish and wait for confirms; row_id -> None (confirmed) or refusal reason."""

    def idle(self) -> None:
        """Called between polls while there is nothing to publish: serve the connection's
        heartbeats (a no-op for a client that does so on its own thread)."""

    def close(self) -> None:
        """Release the connection; idempotent."""


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

    def wake(self) -> None:
        """A notification says new messages may be there: end a ``run_once`` wait now
        (a no-op for a broker source, whose client wakes on delivery)."""

    def close(self) -> None:
        """Stop consuming; unacked messages go back to the broker. Idempotent."""


__all__ = ["BrokerUnavailable", "Ingest", "Outgoing", "Publisher", "Rejected", "Source"]
