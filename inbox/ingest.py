"""Ingest: make received messages durable as inbox rows (the ``Ingest`` that
a source hands them to: ``outbox.transport``).

One statement per batch; a duplicate ``(event_id, consumer)`` bumps ``duplicates`` instead of
raising, so the transaction is never aborted (G3). Unknown types and rejected (malformed)
messages are stored ``failed`` with the reason at once: kept, never retried in a loop.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid5

from sqlalchemy import Connection, Engine

from inbox.consumer import Consumer
from inbox.engine.part import ConsumerPart
from inbox.sql import contract as queries_contract
from inbox.sql import ingest as queries_ingest
from inbox.sql.ingest import UNKNOWN_TYPE
from outbox import states
from outbox.clock import utcnow
from outbox.serialization import DEFAULT_SERIALIZER, serialize
from outbox.transport import Rejected
from outbox.wire import H_EVENT_ID, H_KEY, H_PRIORITY, H_QUEUE, H_TYPE, Envelope

# Event ids of messages too broken to carry one: derived from their bytes, so a redelivery
# of the same broken message is the same inbox row (and counted as a duplicate).
_REJECTED_NAMESPACE = UUID("6f7b1a52-3c1e-4f0e-9a55-0b0e5c7d2a10")
_MAX_NAME = 255


@dataclass(frozen=True)
class IngestResult:
    inserted: int
    duplicates: int
    failed: int


class InboxIngest(ConsumerPart):
    """Ingests for one consumer. ``__call__`` commits (for broker sources); ``within`` writes
    into a transaction the caller owns (the database source marks the outbox rows sent in
    the same one)."""

    def __init__(
        self, consumer: Consumer, engine: Engine, clock: Callable[[], datetime] = utcnow
    ) -> None:
        super().__init__(consumer, engine, clock)
        self.on_ingested: Callable[[IngestResult], None] | None = None

    def __call__(self, messages: Sequence[Envelope | Rejected]) -> None:
        if not messages:
            return
        with self.engine.begin() as conn:
            result = self.within(conn, messages)
        if self.on_ingested is not None:
            self.on_ingested(result)

    def within(self, conn: Connection, messages: Sequence[Envelope | Rejected]) -> IngestResult:
        now = self.clock()
        rows = [self._row(m, now) for m in messages]
        failed = sum(1 for r in rows if r["state"] == states.FAILED)
        inserted = duplicates = 0
        dialect = self.dialect
        for batch in _distinct_batches(rows):
            if not dialect.returning:
                rowcount = conn.execute(queries_ingest.ingest_mysql(self.inbox), batch).rowcount
                duplicates += rowcount - len(batch)
                inserted += len(batch) - (rowcount - len(batch))
                continue
            if dialect.json_recordsets:
                parameters = {"rows": queries_ingest.as_recordset(batch)}
                statement = queries_ingest.ingest_recordset(self.inbox)
                returned = conn.execute(statement, parameters).all()
            else:
                statement = queries_ingest.ingest_returning(dialect, self.inbox)
                returned = conn.execute(statement, batch).all()
            fresh = sum(1 for r in returned if r.duplicates == 0)
            inserted += fresh
            duplicates += len(returned) - fresh
        keys = [r["sequence_key"] for r in rows if r["sequence_key"] is not None]
        if keys:  # each key's counter of applied numbers, at 0 the first time
            conn.execute(
                queries_contract.create_sequences(dialect, self.schema.inbox_sequences),
                queries_contract.sequence_rows(self.consumer.name, keys),
            )
        if inserted and dialect.notifies:
            conn.execute(
                dialect.notify(self.consumer.config.notify_channel, wake_payload(self.consumer))
            )
        return IngestResult(inserted, duplicates, failed)

    def _row(self, message: Envelope | Rejected, now: datetime) -> dict[str, Any]:
        if isinstance(message, Rejected):
            return self._rejected_row(message, now)
        headers = dict(message.headers)
        if message.key is not None:
            headers[H_KEY] = message.key
        row: dict[str, Any] = {
            "event_id": message.event_id,
            "consumer": self.consumer.name,
            "queue": message.queue,
            "priority": message.priority,
            "serial_group": message.serial_group,
            "seq": message.outbox_id,
            "type": message.type,
            "payload": message.body,
            "headers": serialize("headers", headers, DEFAULT_SERIALIZER),
            "state": states.READY,
            "attempts": 0,
            "available_at": now,
            "last_error": None,
            "occurred_at": message.occurred_at,
            "received_at": now,
            "finished_at": None,
            "effect_key": message.effect_key,
            "sequence_key": message.sequence_key,
            "sequence": message.sequence,
            "schema_version": message.schema_version,
        }
        if self.consumer.handler_for(message.type) is None:
            row["state"] = states.FAILED
            row["finished_at"] = now
            row["last_error"] = unknown_type_reason(self.consumer, message.type)
        return row

    def _rejected_row(self, message: Rejected, now: datetime) -> dict[str, Any]:
        headers = {str(k): str(v) for k, v in message.headers.items()}
        try:
            event_id = UUID(headers[H_EVENT_ID])
        except (KeyError, ValueError):
            digest = hashlib.sha256(message.body)
            for k in sorted(headers):
                digest.update(f"\0{k}\0{headers[k]}".encode())
            event_id = uuid5(_REJECTED_NAMESPACE, digest.hexdigest())
        try:
            priority = int(headers.get(H_PRIORITY, "0"))
        except ValueError:
            priority = 0
        if not -32768 <= priority <= 32767:
            priority = 0
        excerpt = message.body[:200].decode("utf-8", errors="replace")
        return {
            "event_id": event_id,
            "consumer": self.consumer.name,
            "queue": headers.get(H_QUEUE, "")[:_MAX_NAME],
            "priority": priority,
            "serial_group": None,  # a broken message never holds a group
            "seq": 0,
            "type": headers.get(H_TYPE, "")[:_MAX_NAME],
            "payload": None,
            "headers": serialize("headers", headers, DEFAULT_SERIALIZER),
            "state": states.FAILED,
            "attempts": 0,
            "available_at": now,
            "last_error": f"rejected from {message.origin or 'broker'}: {message.reason}; "
            f"body starts {excerpt!r}",
            "occurred_at": None,
            "received_at": now,
            "finished_at": now,
            "effect_key": None,
            "sequence_key": None,
            "sequence": None,
            "schema_version": None,
        }


def unknown_type_reason(consumer: Consumer, message_type: str) -> str:
    """Why a message that no handler of ``consumer`` takes is stored failed. The type is
    quoted as an SQL literal, the one quoting that the database source's one-statement take
    (``inbox.sql.ingest.take_into_inbox``) writes the same."""
    quoted = "'" + message_type.replace("'", "''") + "'"
    return UNKNOWN_TYPE + quoted + unknown_type_suffix(consumer)


def unknown_type_suffix(consumer: Consumer) -> str:
    """What follows the type in ``unknown_type_reason``."""
    return f": consumer {consumer.name!r} has no handler for it"


def wake_payload(consumer: Consumer) -> str:
    """NOTIFY payload telling a consumer's workers there is work (queue names have no ':')."""
    return f"inbox:{consumer.name}"[:7999]


def _distinct_batches(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split so no statement holds the same event twice (PostgreSQL refuses to update one row
    twice in one ON CONFLICT statement); repeats go to later statements as duplicates."""
    batches: list[list[dict[str, Any]]] = []
    seen_in: list[set[Any]] = []
    for row in rows:
        for batch, seen in zip(batches, seen_in, strict=True):
            if row["event_id"] not in seen:
                batch.append(row)
                seen.add(row["event_id"])
                break
        else:
            batches.append([row])
            seen_in.append({row["event_id"]})
    return batches
