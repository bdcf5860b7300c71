"""Every SQL statement of the producer side, one function per statement.

The producer's dialect differences: PostgreSQL and SQLite refuse duplicates with
``ON CONFLICT DO NOTHING ... RETURNING``; MariaDB/MySQL with an ``ON DUPLICATE KEY UPDATE`` that
bumps ``store_conflicts`` so the rowcount says how many rows were duplicates. Neither raises,
so the caller's transaction is never aborted (an error would poison a PostgreSQL transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Integer,
    Select,
    SmallInteger,
    Table,
    Text,
    bindparam,
    cast,
    delete,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.sql.dml import Delete, Update

from outbox.dialect import POSTGRESQL, SQLITE, Dialect

# Statements are built once per table and reused: SQLAlchemy then finds their compiled form
# in its cache. A ``values([...])`` statement built per call is compiled per call (~0.5 ms).

_COLUMNS = (
    "event_id", "queue", "priority", "serial_group", "key", "type", "payload", "headers",
    "occurred_at", "available_at", "status", "attempts",
    "effect_key", "sequence_key", "sequence", "schema_version",
)  # fmt: skip


@lru_cache(maxsize=32)
def insert_postgresql(table: Table, channel: str) -> Select[Any]:
    """Insert rows given as parallel arrays, skip duplicates, ``pg_notify`` per inserted row.

    One statement and one round trip for any number of rows (``unnest`` of one array per
    column). NOTIFY inside the transaction is delivered only on commit, and PostgreSQL folds
    identical notifications of one transaction into one.
    """
    element_types: dict[str, Any] = {
        "event_id": postgresql.UUID(as_uuid=True),
        "priority": SmallInteger(),
        "attempts": Integer(),
        "sequence": BigInteger(),
        "occurred_at": DateTime(timezone=True),
        "available_at": DateTime(timezone=True),
    }
    arrays: list[ColumnElement[Any]] = []
    for name in _COLUMNS:
        array = func.unnest(
            bindparam(name, type_=postgresql.ARRAY(element_types.get(name, Text())))
        )
        arrays.append(cast(array, postgresql.JSONB()) if name in ("payload", "headers") else array)
    inserted = (
        POSTGRESQL.insert_or_ignore(table, ["event_id"])
        .from_select(list(_COLUMNS), select(*arrays))
        .returning(table.c.event_id, table.c.queue)
        .cte("inserted")
    )
    return select(inserted.c.event_id, func.pg_notify(channel, inserted.c.queue))


@lru_cache(maxsize=32)
def insert_postgresql_one(table: Table, channel: str) -> Select[Any]:
    """``insert_postgresql`` for a single row, with scalar parameters.

    Dumping sixteen one-element arrays costs psycopg more than the round trip itself, and
    ``store()`` of one message is the common call.
    """
    inserted = (
        POSTGRESQL.insert_or_ignore(table, ["event_id"])
        .values({name: bindparam(name, type_=table.c[name].type) for name in _COLUMNS})
        .returning(table.c.event_id, table.c.queue)
        .cte("inserted")
    )
    return select(inserted.c.event_id, func.pg_notify(channel, inserted.c.queue))


def as_arrays(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rows -> one list per column, the parameters of ``insert_postgresql``."""
    return {name: [row[name] for row in rows] for name in _COLUMNS}


@lru_cache(maxsize=32)
def insert_sqlite(table: Table) -> Any:
    """Executed with a list of rows: SQLAlchemy batches them into multi-row INSERTs."""
    return SQLITE.insert_or_ignore(table, ["event_id"]).returning(
        table.c.event_id, sort_by_parameter_order=True
    )


@lru_cache(maxsize=32)
def insert_mysql(table: Table) -> Any:
    """Rowcount = inserted + 2 x duplicates (a duplicate's row is changed: counter + 1).

    The 1 is a literal, not a parameter: PyMySQL's executemany rewrites the statement into one
    multi-row INSERT and cannot format a parameter in the ON DUPLICATE KEY UPDATE tail.
    """
    return mysql.insert(table).on_duplicate_key_update(
        store_conflicts=table.c.store_conflicts + literal_column("1")
    )


def existing_event_ids(table: Table, event_ids: Sequence[UUID]) -> Select[Any]:
    """Which of ``event_ids`` were there before us (MariaDB duplicate report)."""
    return select(table.c.event_id).where(
        table.c.event_id.in_(list(event_ids)), table.c.store_conflicts > 0
    )


def delete_events(table: Table, event_ids: Sequence[UUID]) -> Delete:
    """Undo the rows a refused ``store_many()`` inserted (still uncommitted, seen by no one)."""
    return delete(table).where(table.c.event_id.in_(list(event_ids)))


# --- sequence numbers -------------------------------------------------------------------------


@lru_cache(maxsize=32)
def take_numbers(dialect: Dialect, counters: Table) -> Any:
    """Reserve ``count`` numbers of ``sequence_key``: ``last`` grows by ``count``, and a key
    seen for the first time starts at ``count``. The new ``last`` comes back where the
    dialect has RETURNING (elsewhere read it with ``last_number``).

    The upsert keeps the counter row locked until the caller's transaction ends: producers
    of one key wait for each other, other keys do not, and a rollback undoes the increment.
    Parameters: ``key``, ``count``.
    """
    count = bindparam("count", type_=BigInteger())
    stmt = dialect.upsert(counters, ["sequence_key"], {"last": counters.c["last"] + count}).values(
        sequence_key=bindparam("key"), last=count
    )
    if dialect.returning:
        stmt = stmt.returning(counters.c["last"])
    return stmt


@lru_cache(maxsize=32)
def last_number(counters: Table) -> Select[Any]:
    """The counter of ``sequence_key`` as this transaction left it (it holds the row's lock,
    and a transaction always reads its own writes)."""
    return select(counters.c["last"]).where(counters.c.sequence_key == bindparam("key"))


@lru_cache(maxsize=32)
def give_back_numbers(counters: Table) -> Update:
    """Undo ``take_numbers`` for a batch that was refused after it took them (duplicate
    event id), while this transaction still holds the row: the key keeps no gap.
    Parameters: ``key``, ``count``."""
    return (
        update(counters)
        .where(counters.c.sequence_key == bindparam("key"))
        .values(last=counters.c["last"] - bindparam("count", type_=BigInteger()))
    )


def message_columns(table: Table) -> list[Any]:
    """The outbox columns ``outbox.wire.envelope_from_row`` reads: what every reader of
    outbox rows that builds messages (the relay, the database source) selects."""
    c = table.c
    return [
        c.id, c.event_id, c.queue, c.priority, c.serial_group, c.key, c.type, c.payload,
        c.headers, c.occurred_at, c.effect_key, c.sequence_key, c.sequence, c.schema_version,
    ]  # fmt: skip
