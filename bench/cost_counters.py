"""The database's counters for ``bench/cost.py``, one class per dialect.

PostgreSQL: ``pg_stat_database`` of the bench database (commits; rows inserted, updated,
deleted; rows scanned = ``tup_returned``, fetched = ``tup_fetched``), WAL bytes
(``pg_current_wal_lsn()``: the whole server's, other databases' load included) and, when
``pg_stat_statements`` is preloaded, its statements in the bench database.
MariaDB: ``SHOW GLOBAL STATUS``: Handler_read_* (summed: rows read), Handler_write, _update,
_delete, Com_commit and Handler_commit, redo bytes from ``Innodb_lsn_current`` (else
``Innodb_os_log_written``). 10.11 has no Innodb_rows_*. Global counters include whatever
else the server does meanwhile; the session counters of the bench's own connections are
subtracted. SQLite: none (the done count only).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import psycopg
import pymysql
from sqlalchemy.engine import URL, make_url

from bench.consumer_support import ADMIN, libpq_dsn
from bench.cost_probe import ServerThreads, Usage, pids_of, settle

DONE_SQL = "SELECT count(*) FROM inbox WHERE state = 'done'"
HOLD_SQL = "SELECT id FROM outbox ORDER BY id LIMIT 1"
PG_COUNTERS = (
    "xact_commit",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
    "tup_returned",
    "tup_fetched",
)
MARIA_SESSION = (
    "rows_read",
    "Handler_write",
    "Handler_update",
    "Handler_delete",
    "Com_commit",
    "Handler_commit",
)


class Link:
    """One DB-API connection (psycopg or PyMySQL: both take ``%s`` parameters)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements = 0
        self.ident = 0  # the server's backend pid / connection id

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        self.statements += 1
        cursor = self.conn.cursor()
        try:
            cursor.execute(sql, params or None)
            return [tuple(r) for r in cursor.fetchall()] if cursor.description else []
        finally:
            cursor.close()

    def one(self, sql: str, *params: Any) -> Any:
        return self.rows(sql, *params)[0][0]

    def close(self) -> None:
        self.conn.close()


def pg_link(url: URL, autocommit: bool = True) -> Link:
    link = Link(psycopg.connect(libpq_dsn(url), autocommit=autocommit))
    link.ident = int(link.one("SELECT pg_backend_pid()"))
    return link


def maria_link(url: URL) -> Link:
    conn = pymysql.connect(
        host=url.host,
        port=url.port or 3306,
        user=url.username,
        password=url.password or "",
        database=url.database,
        autocommit=True,
    )
    link = Link(conn)
    link.ident = int(link.one("SELECT CONNECTION_ID()"))
    return link


def maria_status(link: Link, scope: str) -> Usage:
    """``scope`` GLOBAL or SESSION (a constant of ours, never input)."""
    values = {str(k): v for k, v in link.rows(f"SHOW {scope} STATUS")}

    def number(name: str) -> float:
        try:
            return float(values.get(name, 0))
        except ValueError:
            return 0.0

    usage = {name: number(name) for name in MARIA_SESSION if name != "rows_read"}
    usage["rows_read"] = sum(number(k) for k in values if k.startswith("Handler_read_"))
    if scope == "GLOBAL":
        usage["redo"] = number("Innodb_lsn_current") or number("Innodb_os_log_written")
    return usage


@dataclass
class Statement:
    query: str
    calls: int
    total_ms: float
    rows: int
    blocks: int  # shared_blks_hit + shared_blks_read


class Reader:
    """Reads the done count while the drain runs; ``close`` returns what its own queries
    added to the counters (to subtract)."""

    def __init__(self, link: Link | None = None, path: str = "") -> None:
        self.link, self.path = link, path

    def count(self) -> int:
        if self.link is not None:
            return int(self.link.one(DONE_SQL))
        with closing(sqlite3.connect(self.path, timeout=60)) as conn:
            return int(conn.execute(DONE_SQL).fetchone()[0])

    def own_scanned(self) -> float:
        """Rows this connection has read so far, where they count (MariaDB's counters)."""
        return 0.0

    def close(self) -> Usage:
        if self.link is not None:
            self.link.close()
        return {}


class Counters:
    """SQLite: no counters, and no snapshot held (SQLite has one writer anyway)."""

    statements_available = False

    def __init__(self, url: URL) -> None:
        self.url = url

    def prepare(self) -> None:
        """After the messages are stored, before the first snapshot."""

    def snapshot(self) -> Usage:
        return {}

    def scanned(self) -> float | None:
        """The rows-scanned counter now (the ``--windows`` figures), None if none."""
        return None

    def reader(self) -> Reader:
        return Reader(path=str(self.url.database))

    def hold(self) -> Reader | None:
        return None

    def server_threads(self, exclude: set[int]) -> ServerThreads:
        return ServerThreads()

    def top(self) -> tuple[list[Statement], float | None]:
        """The five statements of the most total time, and the WAL bytes of every statement
        of the bench database."""
        return [], None

    def close(self) -> None:
        pass


class PgReader(Reader):
    def close(self) -> Usage:
        assert self.link is not None
        self.link.close()
        return {"xact_commit": float(self.link.statements)}


class PgHold(Reader):
    def close(self) -> Usage:
        assert self.link is not None
        self.link.conn.rollback()  # no commit counted
        self.link.close()
        return {}


class PgBackends(ServerThreads):
    def __init__(self, name: str, exclude: set[int]) -> None:
        self.name, self.exclude = name, exclude
        self.link = pg_link(make_url(ADMIN["postgresql"]))

    def paths(self) -> list[str]:
        pids = self.link.rows("SELECT pid FROM pg_stat_activity WHERE datname = %s", self.name)
        return [f"/proc/{pid}/stat" for (pid,) in pids if pid not in self.exclude]

    def close(self) -> Usage:
        self.link.close()
        return {}


class PgCounters(Counters):
    def __init__(self, url: URL) -> None:
        super().__init__(url)
        self.name = str(url.database)
        self.admin = pg_link(make_url(ADMIN["postgresql"]))
        preload = str(self.admin.one("SHOW shared_preload_libraries"))
        self.statements_available = "pg_stat_statements" in preload
        self.dbid = int(self.admin.one("SELECT oid FROM pg_database WHERE datname = %s", self.name))

    def prepare(self) -> None:
        if not self.statements_available:
            return
        link = pg_link(self.url)
        try:
            link.rows("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            link.rows("SELECT pg_stat_statements_reset(0, %s::oid, 0)", self.dbid)
        finally:
            link.close()

    def _read(self) -> Usage:
        self.admin.rows("SELECT pg_stat_clear_snapshot()")
        columns = ", ".join(PG_COUNTERS)  # constants of ours
        sql = f"SELECT {columns} FROM pg_stat_database WHERE datname = %s"
        return dict(zip(PG_COUNTERS, map(float, self.admin.rows(sql, self.name)[0]), strict=True))

    def _busy(self) -> bool:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        return bool(self.admin.one(sql + " AND backend_type = 'client backend'", self.name))

    def snapshot(self) -> Usage:
        usage = settle(self._read, self._busy, f"pg_stat_database {self.name}")
        usage["wal"] = float(self.admin.one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"))
        return usage

    def scanned(self) -> float | None:
        return self._read()["tup_returned"]

    def reader(self) -> Reader:
        link = pg_link(self.url)
        link.rows("SET track_counts = off")
        if self.statements_available:
            link.rows("SET pg_stat_statements.track = 'none'")
        return PgReader(link)

    def hold(self) -> Reader:
        link = pg_link(self.url, autocommit=False)
        link.conn.rollback()
        link.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        link.rows("SET track_counts = off")
        link.rows(HOLD_SQL)  # the snapshot is taken, and kept until close
        return PgHold(link)

    def server_threads(self, exclude: set[int]) -> ServerThreads:
        return PgBackends(self.name, exclude)

    def top(self) -> tuple[list[Statement], float | None]:
        if not self.statements_available:
            return [], None
        link = pg_link(self.url)
        try:
            rows = link.rows(
                "SELECT query, calls, total_exec_time, rows, shared_blks_hit + shared_blks_read,"
                " wal_bytes FROM pg_stat_statements WHERE dbid = %s::oid"
                " ORDER BY total_exec_time DESC",
                self.dbid,
            )
        finally:
            link.close()
        top = [Statement(str(r[0]), int(r[1]), float(r[2]), int(r[3]), int(r[4])) for r in rows]
        return top[:5], float(sum(r[5] for r in rows))

    def close(self) -> None:
        self.admin.close()


class MariaReader(Reader):
    def own_scanned(self) -> float:
        assert self.link is not None
        return maria_status(self.link, "SESSION")["rows_read"]

    def close(self) -> Usage:
        assert self.link is not None
        own = maria_status(self.link, "SESSION")
        if not self.link.conn.get_autocommit():
            self.link.conn.rollback()
        self.link.close()
        return own


class MariaThreads(ServerThreads):
    from_first_sight = True

    def __init__(self, name: str, exclude: set[int]) -> None:
        self.name, self.exclude = name, exclude
        self.link = maria_link(make_url(ADMIN["mariadb"]))
        self.server = (pids_of("mariadbd", exact=True) or [0])[0]

    def paths(self) -> list[str]:
        sql = "SELECT ID, TID FROM information_schema.PROCESSLIST WHERE DB = %s"
        threads = self.link.rows(sql, self.name)
        return [f"/proc/{self.server}/task/{t}/stat" for i, t in threads if i not in self.exclude]

    def close(self) -> Usage:
        own = maria_status(self.link, "SESSION")
        self.link.close()
        return own


class MariaCounters(Counters):
    def __init__(self, url: URL) -> None:
        super().__init__(url)
        self.name = str(url.database)
        self.admin = maria_link(make_url(ADMIN["mariadb"]))

    def _busy(self) -> bool:
        sql = "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = %s"
        return bool(self.admin.one(sql, self.name))

    def snapshot(self) -> Usage:
        settle(Usage, self._busy, f"MariaDB {self.name}")  # global counters never stand still
        # Less this connection's own reads (the busy checks, ``--windows``) so far.
        own = maria_status(self.admin, "SESSION")
        return {k: v - own.get(k, 0.0) for k, v in maria_status(self.admin, "GLOBAL").items()}

    def scanned(self) -> float | None:
        return maria_status(self.admin, "GLOBAL")["rows_read"]

    def reader(self) -> Reader:
        return MariaReader(maria_link(self.url))

    def hold(self) -> Reader:
        link = maria_link(self.url)
        link.conn.autocommit(False)
        link.rows("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        link.rows(HOLD_SQL)
        return MariaReader(link)

    def server_threads(self, exclude: set[int]) -> ServerThreads:
        return MariaThreads(self.name, exclude)

    def close(self) -> None:
        self.admin.close()


def counters_for(dialect: str, url: URL) -> Counters:
    if dialect == "postgresql":
        return PgCounters(url)
    if dialect == "mariadb":
        return MariaCounters(url)
    return Counters(url)
