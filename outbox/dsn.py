"""Database URLs: the forms users type, the driver we use, and masking for output."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

from outbox.errors import ConfigError

_DRIVERS = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
    "mariadb+pymysql": "mysql+pymysql",
}
_PASSWORD_IN_URL = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]*@")


def normalize(dsn: str) -> URL:
    """``postgresql://`` -> psycopg 3, ``mysql://``/``mariadb://`` -> PyMySQL, others as given."""
    if not dsn:
        raise ConfigError("dsn: empty; pass --dsn or set OUTBOX_DSN")
    try:
        url = make_url(dsn)
    except Exception as exc:
        raise ConfigError(f"dsn: cannot parse {mask(dsn)!r}: {exc}") from exc
    driver = _DRIVERS.get(url.drivername)
    if driver:
        url = url.set(drivername=driver)
    return url


def mask(text: str) -> str:
    """Replace every password in URLs inside ``text`` with ``***``."""
    return _PASSWORD_IN_URL.sub(r"\g<scheme>***@", text)


def make_engine(dsn: str | URL, **kwargs: Any) -> Engine:
    """An engine for our own processes (relay, worker, CLI); never used by ``store()``.

    On SQLite every transaction starts with ``BEGIN IMMEDIATE``: our processes read then
    write, and a deferred transaction that upgrades to a write lock can fail with "database
    is locked" whatever the busy timeout.
    """
    url = dsn if isinstance(dsn, URL) else normalize(dsn)
    if url.get_backend_name() == "sqlite":
        engine = create_engine(url, **kwargs)
        _sqlite_pragmas(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def _sqlite_pragmas(engine: Engine) -> None:
    # WAL lets readers go on while the one writer works; busy_timeout turns "database is
    # locked" into a wait, which is what several local processes on one file need.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
        # Take transaction control from pysqlite so the "begin" hook below decides.
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
