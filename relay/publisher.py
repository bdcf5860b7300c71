"""The one small interface every publisher implements (RabbitMQ, Kafka, test fakes).

Contract (checked by tests/integration/relay/contract, which every publisher must pass):

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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

    def close(self) -> None:
        """Release the connection; idempotent."""
