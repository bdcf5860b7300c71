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
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.sql.dml import Delete

from outbox.dialect import POSTGRESQL, SQLITE

# Statements are built once per table and reused: SQLAlchemy then finds their compiled form
# in its cache. A ``values([...])`` statement built per call is compiled per call (~0.5 ms).

_COLUMNS = (
    "event_id", "queue", "priority", "serial_group", "key", "type", "payload", "headers",
    "occurred_at", "available_at", "status", "attempts",
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

    Dumping twelve one-element arrays costs psycopg more than the round trip itself, and
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
