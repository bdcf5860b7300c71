"""Every relay statement compiles on every dialect, with the locking each one needs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect

from outbox.dialect import POSTGRESQL
from outbox.schema import outbox_table
from relay import queries

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DIALECTS: dict[str, Dialect] = {
    "postgresql": postgresql.dialect(),
    "mariadb": mysql.dialect(is_mariadb=True),
    "sqlite": sqlite.dialect(),
}


def compiled(stmt: object, dialect: str) -> str:
    return str(stmt.compile(dialect=DIALECTS[dialect]))  # type: ignore[attr-defined]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fetch_locks_with_skip_locked_except_on_sqlite(dialect: str) -> None:
    lock = dialect != "sqlite"
    sql = compiled(queries.fetch_due(outbox_table, limit=10, queues=(), lock=lock), dialect)
    assert ("SKIP LOCKED" in sql) is lock
    assert "ORDER BY outbox.priority, outbox.id" in sql
    assert "NOT (EXISTS" in sql and "earlier.id < outbox.id" in sql
    assert "IN (" not in sql  # no queue filter when none was asked for


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fetch_filters_queues_with_bound_parameters(dialect: str) -> None:
    stmt = queries.fetch_due(
        outbox_table, limit=5, queues=("a'; DROP TABLE outbox; --",), lock=False
    )
    sql = compiled(stmt, dialect)
    assert "DROP TABLE" not in sql
    assert "outbox.queue IN" in sql


@pytest.mark.parametrize("dialect", DIALECTS)
def test_marks_are_conditional_on_pending(dialect: str) -> None:
    sent = compiled(queries.mark_sent(outbox_table, arrays=dialect == "postgresql"), dialect)
    refused = compiled(
        queries.mark_refused(
            outbox_table,
            1,
            attempts_before=0,
            attempts=1,
            status="pending",
            available_at=NOW,
            error="x",
        ),
        dialect,
    )
    for sql in (sent, refused):
        assert sql.startswith("UPDATE outbox SET")
        # Checked on the rows found by id (``per_row``), never as an index range.
        assert "coalesce(outbox.status, outbox.status) =" in sql.lower()
        assert "outbox.id" in sql
    assert "outbox.attempts =" in refused


def test_listen_quotes_the_channel() -> None:
    statement = POSTGRESQL.listen('odd"name')
    assert statement.as_string() == 'LISTEN "odd""name"'


def test_mark_sent_sends_the_ids_as_one_array_where_the_database_has_arrays() -> None:
    # One statement text whatever the batch's size: nothing expanded per call.
    array = compiled(queries.mark_sent(outbox_table, arrays=True), "postgresql")
    assert "outbox.id = ANY (%(ids)s::BIGINT[])" in array
    listed = compiled(queries.mark_sent(outbox_table, arrays=False), "mariadb")
    assert "outbox.id IN (__[POSTCOMPILE_ids])" in listed
