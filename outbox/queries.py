"""Every SQL statement of the producer side, one function per statement.

The producer's dialect differences: PostgreSQL and SQLite refuse duplicates with
``ON CONFLICT DO NOTHING ... RETURNING``; MariaDB/MySQL with an ``ON DUPLICATE KEY UPDATE`` that
bumps ``store_conflicts`` so the rowcount says how many rows were duplicates. Neither raises,
so the caller's transaction is never aborted (an error would poison a PostgreSQL transaction).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Insert,
    Select,
    SmallInteger,
    Table,
    Text,
    any_,
    bindparam,
    cast,
    column,
    delete,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect as SQLAlchemyDialect
from sqlalchemy.sql.dml import Delete, Update
from sqlalchemy.types import TypeEngine

from outbox.dialect import POSTGRESQL, SQLITE, Dialect

# Statements are built once per table and reused: SQLAlchemy then finds their compiled form
# in its cache. A ``values([...])`` statement built per call is compiled per call (~0.5 ms).

_COLUMNS = (
    "event_id", "queue", "priority", "serial_group", "key", "type", "payload", "headers",
    "occurred_at", "available_at", "status", "attempts",
    "effect_key", "sequence_key", "sequence", "schema_version",
)  # fmt: skip


# Sent by ``store()`` on PostgreSQL: the other two have server defaults equal to what a new
# row gets (``status`` 'pending', ``attempts`` 0), so they are left to the server.
_PG_COLUMNS = tuple(c for c in _COLUMNS if c not in ("status", "attempts"))
# jsonb_to_recordset column types; payload and headers arrive as JSON strings (text) and
# are cast, so a serializer's output can never change the record's other fields.
_RECORD_TYPES: dict[str, Any] = {
    "event_id": postgresql.UUID(as_uuid=True),
    "priority": SmallInteger(),
    "sequence": BigInteger(),
    "occurred_at": postgresql.TIMESTAMP(timezone=True),
    "available_at": postgresql.TIMESTAMP(timezone=True),
}


def _returning_pg(table: Table, channel: str | None) -> list[ColumnElement[Any]]:
    """``event_id`` of each inserted row and, with a channel, its ``pg_notify``: NOTIFY in the
    transaction is delivered only on commit, and PostgreSQL folds a transaction's identical
    notifications into one."""
    returning: list[ColumnElement[Any]] = [table.c.event_id]
    if channel is not None:
        notify_channel = bindparam("notify_channel", channel, type_=Text())
        returning.append(func.pg_notify(notify_channel, table.c.queue))
    return returning


@lru_cache(maxsize=32)
def insert_postgresql(table: Table, channel: str | None) -> Insert:
    """Insert the rows of one JSON array (parameter ``rows``, ``as_recordset``), skip
    duplicates, return the inserted event ids (and notify ``channel`` unless None).

    One statement and one round trip for any number of rows. ``jsonb_to_recordset`` of one
    text parameter: psycopg dumps one string instead of sixteen arrays (bench/store.py
    measured both; docs in README).
    """
    values = recordset_columns(_PG_COLUMNS, _RECORD_TYPES)
    return (
        POSTGRESQL.insert_or_ignore(table, ["event_id"])
        .from_select(list(_PG_COLUMNS), select(*values))
        .returning(*_returning_pg(table, channel))
    )


def recordset_columns(names: Sequence[str], types: dict[str, Any]) -> list[Any]:
    """The columns ``names`` of the JSON array parameter ``rows`` read by
    ``jsonb_to_recordset`` (PostgreSQL), each of its type in ``types`` (text otherwise);
    ``payload`` and ``headers`` arrive as JSON text and are cast to JSONB."""
    rows = cast(bindparam("rows", type_=Text()), postgresql.JSONB())
    record = (
        func.jsonb_to_recordset(rows)
        .table_valued(*[column(n, types.get(n, Text())) for n in names])
        .render_derived(name="r", with_types=True)
    )
    return [
        cast(record.c[n], postgresql.JSONB()) if n in ("payload", "headers") else record.c[n]
        for n in names
    ]


def as_recordset(rows: Sequence[dict[str, Any]]) -> str:
    """Rows -> the JSON array ``insert_postgresql`` reads (a parameter value, never SQL)."""
    records = []
    for row in rows:
        record = {n: row[n] for n in _PG_COLUMNS}
        record["event_id"] = str(record["event_id"])
        record["occurred_at"] = record["occurred_at"].isoformat()
        record["available_at"] = record["available_at"].isoformat()
        records.append(record)
    return json.dumps(records, ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=32)
def insert_postgresql_one(table: Table, channel: str | None) -> Insert:
    """``insert_postgresql`` for a single row, with one scalar parameter per column and no
    CTE: ``store()`` of one message is the common call."""
    values = {n: bindparam(n, type_=table.c[n].type) for n in _PG_COLUMNS}
    return (
        POSTGRESQL.insert_or_ignore(table, ["event_id"])
        .values(values)
        .returning(*_returning_pg(table, channel))
    )


@dataclass(frozen=True)
class DriverStatement:
    """A statement compiled once for one SQLAlchemy dialect: its SQL text (from the
    construct, never from values), the parameters it fixes (the channel) and the bind
    processors of the parameters a call gives (None where the driver takes the value as is)."""

    sql: str
    fixed: dict[str, Any]
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]


@lru_cache(maxsize=64)
def driver_statement(statement: Insert, dialect: SQLAlchemyDialect) -> DriverStatement:
    compiled = statement.compile(dialect=dialect)
    given = set(_COLUMNS)
    fixed = {k: b.effective_value for k, b in compiled.binds.items() if k not in given}
    processors = []
    for name, bind in compiled.binds.items():
        if name in given:
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                processors.append((name, processor))
    return DriverStatement(compiled.string, fixed, tuple(processors))


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


def per_row(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """``column`` as an expression that no index holds: a check on a row found by its primary
    key (``id IN (...) AND state = ...``) then stays a filter on the rows found.

    Written plainly, PostgreSQL may instead read the state index (``ix_*_relay``,
    ``ix_*_claim``, ``ix_*_finished``) for every row in that state and AND the two bitmaps: a
    read that grows with the backlog, and with the dead entries vacuum has not yet removed,
    for a statement that touches a batch of rows.
    """
    return func.coalesce(column, column)


def one_of(
    column: ColumnElement[Any],
    name: str,
    *,
    arrays: bool,
    item_type: TypeEngine[Any] | None = None,
) -> ColumnElement[bool]:
    """``column`` equal to one of the values of the list parameter ``name``.

    ``arrays`` (``Dialect.arrays``, PostgreSQL): the list goes as ONE array parameter,
    ``column = ANY(:name)``, of ``item_type`` (by default the column's). The statement's text is
    then the same for any number of values: SQLAlchemy expands nothing per call, psycopg's
    cache of converted queries keeps it (it skips statements of more than 50 parameters) and
    the server prepares one statement, not one per batch size. Elsewhere an expanding ``IN``,
    one parameter per value. Either way the value is a Python list, and an empty one matches
    no row. With an id list, the plan is the same primary-key read as for the ``IN`` list
    (which PostgreSQL itself turns into ``= ANY``); keep the state checks ``per_row``.
    """
    if arrays:
        array = postgresql.ARRAY(column.type if item_type is None else item_type)
        return column == any_(bindparam(name, type_=array))
    return column.in_(bindparam(name, expanding=True))


def message_columns(table: Table) -> list[Any]:
    """The outbox columns ``outbox.wire.envelope_from_row`` reads: what every reader of
    outbox rows that builds messages (the relay, the database source) selects."""
    c = table.c
    return [
        c.id, c.event_id, c.queue, c.priority, c.serial_group, c.key, c.type, c.payload,
        c.headers, c.occurred_at, c.effect_key, c.sequence_key, c.sequence, c.schema_version,
    ]  # fmt: skip
