"""A fresh, migrated database per test, quickly.

PostgreSQL: ``CREATE DATABASE ... TEMPLATE`` from a template migrated once per session.
MariaDB: a new database whose tables are ``CREATE TABLE ... LIKE`` the template's.
SQLite: a copy of a template file migrated once per session.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url

from outbox import migrate
from outbox.dsn import make_engine
from outbox.migrate import VERSION_TABLE
from tests.support import services

DIALECTS = ("postgresql", "mariadb", "sqlite")
# One template per pytest process: concurrent sessions (developers, CI) never drop each
# other's template under a running test.
_TEMPLATE = f"outbox_tpl_{os.getpid()}"


class DatabaseFactory:
    """Creates and drops per-test databases for one dialect; the template is made lazily."""

    def __init__(self, dialect: str, workdir: Path) -> None:
        self.dialect = dialect
        self.workdir = workdir
        self._template_ready = False
        self._admin: Engine | None = None

    def admin(self) -> Engine:
        if self._admin is None:
            if self.dialect == "postgresql":
                self._admin = create_engine(services.PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
            elif self.dialect == "mariadb":
                self._admin = create_engine(
                    services.MARIADB_ADMIN_URL, isolation_level="AUTOCOMMIT"
                )
            else:
                raise ValueError(self.dialect)
        return self._admin

    def check_available(self) -> None:
        if self.dialect == "sqlite":
            return
        try:
            with self.admin().connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:
            services.missing(self.dialect, str(exc).splitlines()[0])

    def _url(self, name: str) -> URL:
        if self.dialect == "sqlite":
            return make_url(f"sqlite:///{self.workdir / name}.db")
        base = make_url(
            services.PG_ADMIN_URL if self.dialect == "postgresql" else services.MARIADB_ADMIN_URL
        )
        return base.set(database=name)

    def _ensure_template(self) -> None:
        if self._template_ready:
            return
        if self.dialect == "postgresql":
            with self.admin().connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{_TEMPLATE}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{_TEMPLATE}"'))
        elif self.dialect == "mariadb":
            with self.admin().connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{_TEMPLATE}`"))
                conn.execute(text(f"CREATE DATABASE `{_TEMPLATE}` CHARACTER SET utf8mb4"))
        engine = make_engine(self._url(_TEMPLATE))
        migrate.upgrade(engine)
        engine.dispose()
        self._template_ready = True

    def create(self) -> URL:
        self.check_available()
        self._ensure_template()
        name = f"outbox_t_{uuid.uuid4().hex[:12]}"
        if self.dialect == "postgresql":
            with self.admin().connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{_TEMPLATE}"'))
        elif self.dialect == "mariadb":
            with self.admin().connect() as conn:
                conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
                tables = (
                    conn.execute(
                        text(
                            "SELECT table_name FROM information_schema.tables"
                            " WHERE table_schema = :s"
                        ),
                        {"s": _TEMPLATE},
                    )
                    .scalars()
                    .all()
                )
                for table in tables:
                    conn.execute(
                        text(f"CREATE TABLE `{name}`.`{table}` LIKE `{_TEMPLATE}`.`{table}`")
                    )
                conn.execute(
                    text(
                        f"INSERT INTO `{name}`.`{VERSION_TABLE}`"
                        f" SELECT * FROM `{_TEMPLATE}`.`{VERSION_TABLE}`"
                    )
                )
        else:
            shutil.copyfile(self._url(_TEMPLATE).database or "", self._url(name).database or "")
        return self._url(name)

    def create_empty(self) -> URL:
        """A database without our tables (for migration tests)."""
        self.check_available()
        name = f"outbox_e_{uuid.uuid4().hex[:12]}"
        if self.dialect == "postgresql":
            with self.admin().connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        elif self.dialect == "mariadb":
            with self.admin().connect() as conn:
                conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        return self._url(name)

    def drop(self, url: URL) -> None:
        name = url.database or ""
        if self.dialect == "postgresql":
            with self.admin().connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        elif self.dialect == "mariadb":
            with self.admin().connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        else:
            for suffix in ("", "-wal", "-shm"):
                Path(name + suffix).unlink(missing_ok=True)

    @contextmanager
    def database(self, empty: bool = False) -> Iterator[URL]:
        url = self.create_empty() if empty else self.create()
        try:
            yield url
        finally:
            self.drop(url)

    def close(self) -> None:
        if self._template_ready and self.dialect != "sqlite":
            self.drop(self._url(_TEMPLATE))
        if self._admin is not None:
            self._admin.dispose()
