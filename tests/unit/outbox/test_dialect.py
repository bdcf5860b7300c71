"""The dialect seam: one object per database family, found from any bind."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import default

from outbox import dialect
from outbox.errors import UnsupportedDatabaseError
from outbox.types import UTCDateTime


def test_each_family_has_one_object_found_from_engine_connection_and_dialect() -> None:
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        assert dialect.dialect_of(conn) is dialect.SQLITE
    assert dialect.dialect_of(engine) is dialect.SQLITE
    assert dialect.dialect_of(postgresql.dialect()) is dialect.POSTGRESQL
    assert dialect.dialect_of(mysql.dialect()) is dialect.MYSQL
    mariadb = mysql.dialect()
    mariadb.name = "mariadb"
    assert dialect.dialect_of(mariadb) is dialect.MYSQL
    assert [d.family for d in (dialect.POSTGRESQL, dialect.MYSQL, dialect.SQLITE)] == [
        "postgresql",
        "mysql",
        "sqlite",
    ]


def test_an_unsupported_database_is_refused() -> None:
    with pytest.raises(UnsupportedDatabaseError):
        dialect.dialect_of(default.DefaultDialect())


def test_capabilities() -> None:
    pg, my, lite = dialect.POSTGRESQL, dialect.MYSQL, dialect.SQLITE
    assert (pg.returning, my.returning, lite.returning) == (True, False, True)
    assert (pg.notifies, my.notifies, lite.notifies) == (True, False, False)
    assert (pg.row_locks, my.row_locks, lite.row_locks) == (True, True, False)
    assert my.gap_locks and not pg.gap_locks and not lite.gap_locks
    with pytest.raises(UnsupportedDatabaseError):
        my.notify("channel", "payload")


def test_insert_or_ignore_per_family() -> None:
    from outbox.schema import outbox_table

    def sql(seam: dialect.Dialect, on: object) -> str:
        statement = seam.insert_or_ignore(outbox_table, ["event_id"])
        return str(statement.compile(dialect=on))  # type: ignore[arg-type]

    assert "ON CONFLICT (event_id) DO NOTHING" in sql(dialect.POSTGRESQL, postgresql.dialect())
    assert "ON CONFLICT (event_id) DO NOTHING" in sql(dialect.SQLITE, sqlite.dialect())
    assert sql(dialect.MYSQL, mysql.dialect()).startswith("INSERT IGNORE")


def test_column_types_fall_back_to_portable_ones_on_an_unknown_dialect() -> None:
    generic = default.DefaultDialect()
    assert dialect.column_types_of(generic).family == ""
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    assert UTCDateTime().process_bind_param(moment, generic) == moment.replace(tzinfo=None)
    assert UTCDateTime().process_bind_param(moment, postgresql.dialect()) == moment


def test_listen_quotes_the_channel() -> None:
    assert dialect.POSTGRESQL.listen('a"b').as_string() == 'LISTEN "a""b"'
