"""Every producer statement compiles on every dialect (the SQL lives in the queries modules;
this keeps it compiling)."""

import json
from datetime import UTC, datetime
from uuid import uuid4

from sqlalchemy.dialects import mysql, postgresql, sqlite

from outbox import outbox_table, queries
from outbox.dialect import MYSQL, POSTGRESQL, SQLITE
from outbox.schema import outbox_sequences_table

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ROW = {
    "event_id": uuid4(), "queue": "q", "priority": 1, "serial_group": None, "key": None,
    "type": "t", "payload": "{}", "headers": "{}", "occurred_at": NOW, "available_at": NOW,
    "status": "pending", "attempts": 0,
    "effect_key": None, "sequence_key": None, "sequence": None, "schema_version": None,
}  # fmt: skip


def test_postgresql_insert_notifies_and_skips_conflicts() -> None:
    statement = queries.insert_postgresql(outbox_table, "ch")
    sql = str(statement.compile(dialect=postgresql.dialect()))
    assert "ON CONFLICT (event_id) DO NOTHING" in sql
    assert "pg_notify" in sql and "RETURNING" in sql and "jsonb_to_recordset" in sql
    # built once, reused (so SQLAlchemy's compiled cache applies)
    assert queries.insert_postgresql(outbox_table, "ch") is statement
    records = json.loads(queries.as_recordset([ROW, ROW]))
    assert len(records) == 2
    # status and attempts are left to their server defaults
    assert set(records[0]) == set(ROW) - {"status", "attempts"}
    # payload and headers travel as JSON strings: a serializer's text stays one field
    assert records[0]["payload"] == "{}" and records[0]["event_id"] == str(ROW["event_id"])


def test_postgresql_insert_without_channel_does_not_notify() -> None:
    for build in (queries.insert_postgresql, queries.insert_postgresql_one):
        sql = str(build(outbox_table, None).compile(dialect=postgresql.dialect()))
        assert "pg_notify" not in sql and "RETURNING outbox.event_id" in sql


def test_postgresql_single_row_insert() -> None:
    sql = str(
        queries.insert_postgresql_one(outbox_table, "ch").compile(dialect=postgresql.dialect())
    )
    assert "ON CONFLICT (event_id) DO NOTHING" in sql and "pg_notify" in sql
    assert "jsonb_to_recordset" not in sql and not sql.startswith("WITH")


def test_driver_statement_is_the_constructs_sql() -> None:
    dialect = postgresql.psycopg.dialect()
    statement = queries.insert_postgresql_one(outbox_table, "ch")
    compiled = queries.driver_statement(statement, dialect)
    assert compiled.sql == str(statement.compile(dialect=dialect))
    assert compiled.fixed == {"notify_channel": "ch"}
    assert queries.driver_statement(statement, dialect) is compiled
    # the column types' own bind processing (UTC datetimes, pre-serialised JSON) still runs
    assert {"occurred_at", "available_at", "payload"} <= {n for n, _ in compiled.processors}


def test_sqlite_insert() -> None:
    sql = str(queries.insert_sqlite(outbox_table).compile(dialect=sqlite.dialect()))
    assert "ON CONFLICT (event_id) DO NOTHING" in sql and "RETURNING" in sql


def test_mysql_insert_counts_conflicts() -> None:
    sql = str(queries.insert_mysql(outbox_table).compile(dialect=mysql.dialect()))
    assert "ON DUPLICATE KEY UPDATE store_conflicts = (outbox.store_conflicts + 1)" in sql
    assert "IGNORE" not in sql


def test_helpers_compile_everywhere() -> None:
    ids = [uuid4(), uuid4()]
    for dialect in (postgresql.dialect(), mysql.dialect(), sqlite.dialect()):
        compiled = queries.existing_event_ids(outbox_table, ids).compile(dialect=dialect)
        sql = " ".join(str(compiled).split())
        assert sql.startswith("SELECT outbox.event_id FROM outbox WHERE outbox.event_id IN")
        assert "outbox.store_conflicts >" in sql, sql
        # only the conflicting ones: the caller reports these as duplicates
        params = compiled.construct_params()
        assert 0 in params.values(), params

        compiled = queries.delete_events(outbox_table, ids).compile(dialect=dialect)
        sql = " ".join(str(compiled).split())
        assert sql.startswith("DELETE FROM outbox WHERE outbox.event_id IN"), sql
        assert "store_conflicts" not in sql


def test_counter_upsert_increments_on_every_dialect() -> None:
    counters = outbox_sequences_table
    cases = [
        (POSTGRESQL, postgresql.dialect(), "ON CONFLICT (sequence_key) DO UPDATE SET", True),
        (SQLITE, sqlite.dialect(), "ON CONFLICT (sequence_key) DO UPDATE SET", True),
        (MYSQL, mysql.dialect(), "ON DUPLICATE KEY UPDATE", False),
    ]
    for seam, dialect, upsert, returning in cases:
        statement = queries.take_numbers(seam, counters)
        sql = " ".join(str(statement.compile(dialect=dialect)).split())
        assert upsert in sql, sql
        # last = last + count, never last = count: the counter only grows
        assert "outbox_sequences.last +" in sql, sql
        assert ("RETURNING" in sql) is returning, sql
        assert queries.take_numbers(seam, counters) is statement  # built once
    sql = str(queries.last_number(counters).compile(dialect=mysql.dialect()))
    assert "FROM outbox_sequences WHERE outbox_sequences.sequence_key =" in " ".join(sql.split())


def test_message_columns_carry_the_contract() -> None:
    names = [c.name for c in queries.message_columns(outbox_table)]
    for name in ("effect_key", "sequence_key", "sequence", "schema_version"):
        assert name in names
