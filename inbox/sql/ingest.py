"""The SQL that moves messages into the inbox: ingest (one statement per batch, a duplicate
``(event_id, consumer)`` bumps ``duplicates`` instead of raising: ``ON CONFLICT DO UPDATE`` on
PostgreSQL and SQLite, ``ON DUPLICATE KEY UPDATE`` on MariaDB/MySQL) and the database
source's take of committed outbox rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Integer,
    Select,
    Table,
    Update,
    bindparam,
    literal_column,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import mysql

from inbox.sql.predicates import FIRST_PARTS, point_ranges, point_values
from outbox import states
from outbox.dialect import Dialect
from outbox.queries import message_columns, per_row

# --- ingest ---------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def ingest_returning(dialect: Dialect, table: Table) -> Any:
    """PostgreSQL / SQLite: insert; a duplicate bumps ``duplicates`` instead of raising.
    Executed with the list of rows (SQLAlchemy's "insertmanyvalues": one compiled statement,
    many rows per round trip).

    RETURNING ``duplicates``: 0 for a row inserted now, >= 1 for a duplicate.
    """
    stmt = dialect.upsert(table, ["event_id", "consumer"], {"duplicates": table.c.duplicates + 1})
    return stmt.returning(table.c.event_id, table.c.duplicates)


@lru_cache(maxsize=64)
def ingest_mysql(table: Table) -> Any:
    """MariaDB/MySQL, executed with the list of rows: rowcount = inserted + 2 x duplicates
    (the duplicate's counter changes)."""
    # A constant, not a parameter: PyMySQL's executemany takes no parameter after VALUES.
    one = literal_column("1", Integer())
    return mysql.insert(table).on_duplicate_key_update(duplicates=table.c.duplicates + one)


# --- database source ------------------------------------------------------------------------


@lru_cache(maxsize=64)
def pending_outbox(
    outbox: Table, dialect: Dialect, shape: tuple[bool, ...] = (), rest: bool = False
) -> Select[Any]:
    """Committed due pending rows of our queues, most urgent first, locked for us; with a
    ``shape`` (``predicates.point_shape``) read from positions (``inbox.positions``) rather
    than from the head of ``ix_outbox_relay``'s pending range: the first parts, or with
    ``rest`` the others (``predicates.point_ranges``). Built once per shape: building it
    costs more than running it. Parameters: ``pending_parameters``."""
    o = outbox.c
    limit = bindparam("limit", type_=Integer)
    parts = point_ranges(o.priority, o.id, shape, dialect.family == "postgresql")
    branches = [
        # SQLite: BEGIN IMMEDIATE already made us the only writer.
        dialect.skip_locked(
            select(*message_columns(outbox))
            .where(
                o.status == states.PENDING,
                o.queue.in_(bindparam("queues", expanding=True)),
                o.available_at <= bindparam("now"),
                part,
            )
            .order_by(o.priority, o.id)
            .limit(limit)
        )
        for part in (parts[FIRST_PARTS:] if rest else parts[:FIRST_PARTS])
    ]
    if not shape:
        return branches[0]
    subqueries = [select(b.subquery(f"part_{i}")) for i, b in enumerate(branches)]
    merged = union_all(*subqueries).subquery("pending")
    m = merged.c
    return select(merged).order_by(m.priority, m.id).limit(limit)


def pending_parameters(
    queues: Sequence[str], now: datetime, limit: int, points: Sequence[tuple[int, int]] = ()
) -> dict[str, Any]:
    """The parameters of ``pending_outbox`` read from ``points``."""
    return {"queues": list(queues), "now": now, "limit": limit, **point_values(points)}


def mark_outbox_sent(outbox: Table, ids: Sequence[int], now: datetime) -> Update:
    o = outbox.c
    return (
        update(outbox)
        .where(o.id.in_(list(ids)), per_row(o.status) == states.PENDING)
        .values(status=states.SENT, sent_at=now)
    )
