"""Revision 0002 on a MariaDB database created by 0001: the name columns become binary."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import text

from outbox.config import DEFAULT_CONFIG
from outbox.dsn import make_engine
from outbox.migrate import _alembic_config
from tests.support.databases import DatabaseFactory


@pytest.mark.parametrize("dialect", ["mariadb"])
def test_upgrade_from_0001_makes_names_binary(db_factory: DatabaseFactory) -> None:
    with db_factory.database(empty=True) as url:
        engine = make_engine(url)
        config = _alembic_config(DEFAULT_CONFIG)
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "0001")
        collations = text(
            "SELECT column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = 'inbox' "
            "AND column_name IN ('consumer', 'queue', 'serial_group', 'type')"
        )
        with engine.connect() as conn:
            before = dict(conn.execute(collations).all())
        assert set(before.values()) != {"utf8mb4_bin"}  # 0001 took the server's default
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
        with engine.connect() as conn:
            after = dict(conn.execute(collations).all())
        engine.dispose()
        assert after == dict.fromkeys(before, "utf8mb4_bin")
