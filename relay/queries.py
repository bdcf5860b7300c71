"""Every SQL statement of the relay, one function per statement.

Dialect differences live here: PostgreSQL and MariaDB lock the fetched batch with
``FOR UPDATE SKIP LOCKED`` so several relays share the work; SQLite has no row locks (one relay
per database file, see relay/sqlite_guard.py). ``now`` is always a parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Select,
    Table,
    TextClause,
    and_,
    bindparam,
    exists,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.sql.dml import Update

from outbox import states
from outbox.queries import message_columns, one_of, per_row


@lru_cache(maxsize=64)
def fetch_due(table: Table, *, limit: int, queues: tuple[str, ...], lock: bool) -> Select[Any]:
    """Due pending rows, most urgent priority first, then id; of each key only its head.

    A keyed row qualifies only when no earlier row of the same (queue, priority, key) is still
    pending: that earlier row may be waiting out a backoff (or a delay), or be locked in
    another relay's batch right now (it is still committed-pending), so either way it must go
    first (G10). Rows without a key are never held back. The probe is one seek on
    ``ix_<table>_key`` (queue, priority, key, status, id).

    Built once per (table, limit, queues, lock): the relay runs it every batch, and building
    a statement costs more than SQLAlchemy's cached compile. Parameter: ``now``.
    """
    earlier = table.alias("earlier")
    held_back = exists(
        select(literal(1)).where(
            earlier.c.queue == table.c.queue,
            earlier.c.priority == table.c.priority,
            earlier.c.key == table.c.key,
            earlier.c.status == states.PENDING,
            earlier.c.id < table.c.id,
        )
    )
    stmt = (
        select(*_columns(table))
        .where(
            table.c.status == states.PENDING,
            table.c.available_at <= bindparam("now", type_=table.c.available_at.type),
            or_(table.c.key.is_(None), ~held_back),
        )
        .order_by(table.c.priority, table.c.id)
        .limit(limit)
    )
    if queues:
        stmt = stmt.where(table.c.queue.in_(list(queues)))
    if lock:
        stmt = stmt.with_for_update(skip_locked=True, of=table)
    return stmt


def fetch_followers(
    table: Table, heads: Sequence[tuple[str, int, str, int]], *, limit: int, lock: bool
) -> Select[Any]:
    """The pending rows after each head ``(queue, priority, key, head_id)`` of this batch.

    Safe to take in the same batch: no other relay can fetch them while their head is pending
    (the NOT EXISTS of ``fetch_due``), and our lock on the head keeps it pending until we
    commit. Ordered by id, so under the LIMIT each key still gets an unbroken prefix; the
    caller cuts each chain at its first row that is not due yet. Locked without SKIP LOCKED:
    skipping one would publish its successor before it.
    """
    chains = [
        and_(
            table.c.queue == queue,
            table.c.priority == priority,
            table.c.key == key,
            table.c.id > head_id,
        )
        for queue, priority, key, head_id in heads
    ]
    stmt = (
        select(*_columns(table))
        .where(table.c.status == states.PENDING, or_(*chains))
        .order_by(table.c.priority, table.c.id)
        .limit(limit)
    )
    if lock:
        stmt = stmt.with_for_update(of=table)
    return stmt


def _columns(table: Table) -> list[Any]:
    # What the message is built from, plus what the relay's bookkeeping reads.
    return [*message_columns(table), table.c.available_at, table.c.attempts]


@lru_cache(maxsize=32)
def mark_sent(table: Table, *, arrays: bool) -> Update:
    """Confirmed by the broker. Conditional on ``pending``: a row an operator touched meanwhile
    keeps the operator's state. Parameters: ``ids``, ``now``.

    ``arrays`` (PostgreSQL): the ids go as one array parameter (``outbox.queries.one_of``).
    """
    return (
        update(table)
        .where(one_of(table.c.id, "ids", arrays=arrays), per_row(table.c.status) == states.PENDING)
        .values(status=states.SENT, sent_at=bindparam("now", type_=table.c.sent_at.type))
    )


def mark_refused(
    table: Table,
    row_id: int,
    *,
    attempts_before: int,
    attempts: int,
    status: str,
    available_at: datetime,
    error: str,
) -> Update:
    """Refused by the broker: count the attempt, set the next try or dead-letter it."""
    return (
        update(table)
        .where(
            table.c.id == row_id,
            per_row(table.c.status) == states.PENDING,
            table.c.attempts == attempts_before,
        )
        .values(attempts=attempts, status=status, available_at=available_at, last_error=error)
    )


def relaxed_commit() -> TextClause:
    """PostgreSQL: this transaction's commit does not wait for the WAL flush.

    Safe for the relay's marks only: if the server crashes and loses a committed ``sent``,
    the row is pending again and published again, the at-least-once duplicate we already
    allow; a lost refusal mark costs one extra try. It saves an fsync per batch.
    """
    return text("SET LOCAL synchronous_commit = off")
