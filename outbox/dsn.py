"""Database URLs: the forms users type, the driver we use, and masking for output."""

from __future__ import annotations

import re
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DisconnectionError

from outbox.errors import ConfigError

_DRIVERS = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
    "mariadb+pymysql": "mysql+pymysql",
}
# ``scheme:`` then any number of slashes (``amqp:/user:pw@host`` is a typo that still
# carries a password), user, ``:``, password, ``@``.
_PASSWORD_IN_URL = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*:/*[^:/@\s]*:)[^@\s]*@")
_BACKENDS = ("postgresql", "mysql", "mariadb", "sqlite")


def normalize(dsn: str) -> URL:
    """``postgresql://`` -> psycopg 3, ``mysql://``/``mariadb://`` -> PyMySQL, others as given."""
    if not dsn:
        raise ConfigError("dsn: empty; pass --dsn or set OUTBOX_DSN")
    try:
        url = make_url(dsn)
    except Exception as exc:
        raise ConfigError(f"dsn: cannot parse {mask(dsn)!r}: {exc}") from exc
    if url.get_backend_name() not in _BACKENDS:
        raise ConfigError(
            f"dsn: {url.get_backend_name()!r} is not a supported database; use "
            "postgresql://, mysql://, mariadb:// or sqlite:///"
        )
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
    engine = create_engine(url, **kwargs)
    prepare(engine, pre_ping=bool(kwargs.get("pool_pre_ping")))
    return engine


def prepare(engine: Engine, *, pre_ping: bool = False) -> None:
    """What every engine of our own processes gets: SQLite's pragmas and ``BEGIN
    IMMEDIATE``, elsewhere a ping of idle connections (unless the pool pings each checkout),
    and PostgreSQL's planner settings. An asyncio engine gets it on its ``sync_engine``."""
    if engine.dialect.name == "sqlite":
        _sqlite_pragmas(engine)
    elif not pre_ping:
        _ping_idle_connections(engine)
    if engine.dialect.name == "postgresql":
        _planner_settings(engine)


# A connection checked in less than this ago is handed out without a ping.
IDLE_BEFORE_PING = 1.0


def _ping_idle_connections(engine: Engine) -> None:
    """``pool_pre_ping``, but only for connections that sat idle in the pool.

    A worker or relay checks a connection out several times per message; pinging each time
    was a third of its round trips. A connection back from use a moment ago is as good as the
    ping would prove; one that sat idle (a database restart, an idle timeout) is pinged and,
    if dead, replaced before use (DisconnectionError makes the pool retry with a new one).
    A connection that dies within that moment fails its statement, which every caller
    already survives (rollback, then retry or lease expiry).
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("checked_in_at")
        if since is not None and time.monotonic() - since < IDLE_BEFORE_PING:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(f"idle connection failed its ping: {exc}") from exc
        if not alive:
            raise DisconnectionError("idle connection failed its ping")


# Why each: psycopg prepares a statement run five times, and PostgreSQL may then switch it to
# a generic plan that cannot see how few rows an id list or a state names (a plan chosen for
# the average, reading an index range of every ready row); and a queue table's statistics are
# those of its last ANALYZE, often taken when it was nearly empty, so the planner prefers a
# sequential scan of a table that has since grown to millions of rows. Our statements all
# have an index to use; these make PostgreSQL use it whatever the statistics say.
_PLANNER_SETTINGS = (
    "SET plan_cache_mode = force_custom_plan",
    "SET enable_seqscan = off",
)


def _planner_settings(engine: Engine) -> None:
    """Each new PostgreSQL connection of our processes plans every statement for its
    parameters, with an index where there is one (one round trip per connection)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        for statement in _PLANNER_SETTINGS:
            cur.execute(statement)
        cur.close()
        dbapi_conn.commit()


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
