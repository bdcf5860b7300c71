"""Migrations produce exactly the schema the code declares, on every database."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from outbox import metadata, migrate
from outbox.dsn import make_engine
from outbox.migrate import VERSION_TABLE
from tests.support.databases import DatabaseFactory


def _diff(engine: Any) -> list[Any]:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        diff = compare_metadata(ctx, metadata)
    # Our own version table is not part of outbox.metadata.
    return [d for d in diff if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)]


def test_migrated_schema_equals_metadata(db_factory: DatabaseFactory) -> None:
    with db_factory.database(empty=True) as url:
        engine = make_engine(url)
        try:
            assert migrate.current_revision(engine) is None
            assert migrate.upgrade(engine) == migrate.head_revision()
            assert _diff(engine) == []
            inspector = inspect(engine)
            indexes = {i["name"] for i in inspector.get_indexes("outbox")}
            assert {"ix_outbox_relay", "ix_outbox_group", "ix_outbox_key"} <= indexes
        finally:
            engine.dispose()


def test_migrate_is_idempotent(db_factory: DatabaseFactory) -> None:
    with db_factory.database(empty=True) as url:
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
            migrate.upgrade(engine)
            assert migrate.current_revision(engine) == migrate.head_revision()
        finally:
            engine.dispose()


def test_sql_mode_prints_ddl_for_the_dialect(db_factory: DatabaseFactory, dialect: str) -> None:
    with db_factory.database(empty=True) as url:
        sql = migrate.upgrade_sql(url)
    assert "CREATE TABLE outbox" in sql
    assert "CREATE TABLE inbox" in sql
    assert "ix_outbox_relay" in sql
    if dialect == "postgresql":
        assert "JSONB" in sql and "TIMESTAMP WITH TIME ZONE" in sql
    if dialect == "mariadb":
        assert "DATETIME(6)" in sql
