"""Every SQL statement of the producer side, one function per statement.

Dialect differences live here and nowhere else: PostgreSQL and SQLite refuse duplicates with
``ON CONFLICT DO NOTHING ... RETURNING``; MariaDB/MySQL with an ``ON DUPLICATE KEY UPDATE`` that
bumps ``store_conflicts`` so the rowcount says how many rows were duplicates. Neither raises,
so the caller's transaction is never aborted (an error would poison a PostgreSQL transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Select, Table, delete, func, select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.sql.dml import Delete

from outbox.errors import UnsupportedDatabaseError

SUPPORTED_DIALECTS = ("postgresql", "mysql", "mariadb", "sqlite")


def dialect_family(conn: Connection) -> str:
    """``postgresql``, ``mysql`` (MariaDB included) or ``sqlite``."""
    name = conn.dialect.name
    if name == "mariadb":
        return "mysql"
    if name not in SUPPORTED_DIALECTS:
        raise UnsupportedDatabaseError(
            f"dialect {name!r} is not supported (PostgreSQL, MariaDB/MySQL, SQLite are)"
        )
    return name


def insert_postgresql(table: Table, rows: Sequence[dict[str, Any]], channel: str) -> Select[Any]:
    """Insert, skip duplicates, and ``pg_notify`` per inserted row: one round trip.

    NOTIFY inside the transaction is delivered only on commit, and PostgreSQL folds identical
    notifications of one transaction into one.
    """
    inserted = (
        postgresql.insert(table)
        .values(list(rows))
        .on_conflict_do_nothing(index_elements=["event_id"])
        .returning(table.c.event_id, table.c.queue)
        .cte("inserted")
    )
    return select(inserted.c.event_id, func.pg_notify(channel, inserted.c.queue))


def insert_sqlite(table: Table, rows: Sequence[dict[str, Any]]) -> Any:
    return (
        sqlite.insert(table)
        .values(list(rows))
        .on_conflict_do_nothing(index_elements=["event_id"])
        .returning(table.c.event_id)
    )


def insert_mysql(table: Table, rows: Sequence[dict[str, Any]]) -> Any:
    """Rowcount = inserted + 2 x duplicates (a duplicate's row is changed: counter + 1)."""
    return (
        mysql.insert(table)
        .values(list(rows))
        .on_duplicate_key_update(store_conflicts=table.c.store_conflicts + 1)
    )


def existing_event_ids(table: Table, event_ids: Sequence[UUID]) -> Select[Any]:
    """Which of ``event_ids`` were there before us (MariaDB duplicate report)."""
    return select(table.c.event_id).where(
        table.c.event_id.in_(list(event_ids)), table.c.store_conflicts > 0
    )


def delete_events(table: Table, event_ids: Sequence[UUID]) -> Delete:
    """Undo the rows a refused ``store_many()`` inserted (still uncommitted, seen by no one)."""
    return delete(table).where(table.c.event_id.in_(list(event_ids)))
