"""The dialect seam: what differs between PostgreSQL, MariaDB/MySQL and SQLite, in one place.

One object per database family, built once at import; ``dialect_of`` finds it from an
engine, a connection, a session or a SQLAlchemy dialect with one dictionary lookup. Callers
ask it about capabilities (``returning``, ``notifies``, ``row_locks`` ...) instead of
comparing names: the family is worked out here and nowhere else.

- Locking reads: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL and MariaDB; SQLite has no row
  locks, its ``BEGIN IMMEDIATE`` (``outbox.dsn.make_engine``) makes a transaction the only
  writer.
- The group lock around [check blockers + claim] (G4): a transaction-scoped advisory lock
  on a namespaced 64-bit key (PostgreSQL), ``GET_LOCK`` on a hashed name with a timeout,
  taken before the transaction and released after its commit so the next holder sees the
  claim (MariaDB/MySQL), the write lock (SQLite). Not obtained in time: ``None`` is
  yielded and the caller tries later; nothing is raised.
- NOTIFY/LISTEN (PostgreSQL), insert-or-ignore and upserts, ``RETURNING``, column types.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    JSON,
    Connection,
    DateTime,
    Engine,
    Insert,
    Select,
    Table,
    func,
    select,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect as SQLAlchemyDialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeEngine

from outbox.errors import UnsupportedDatabaseError
from outbox.group_locks import (
    get_locks_mysql,
    lock_parameters,
    mysql_get_lock,
    mysql_lock_name,
    mysql_release_lock,
    pg_advisory_xact_lock,
    pg_lock_key,
    pg_lock_timeout,
    pg_try_advisory_xact_lock,
    release_locks_mysql,
    try_locks,
    try_locks_pg,
)

if TYPE_CHECKING:
    from psycopg import sql as pg_sql

READ_COMMITTED = "READ COMMITTED"
_PG_LOCK_NOT_AVAILABLE = "55P03"

Bind = Engine | Connection | Session | SQLAlchemyDialect


class Dialect:
    """What a database family can do. Subclasses override; the defaults are PostgreSQL's
    where a capability is common, plain SQL where it is not."""

    family: ClassVar[str] = ""
    # The SQLAlchemy driver name of the asyncio driver (``outbox-relay[asyncio]``).
    async_driver: ClassVar[str] = ""
    #: ``INSERT/UPDATE ... RETURNING``: the changed rows come back in the same round trip.
    returning: ClassVar[bool] = True
    #: ``pg_notify`` / ``LISTEN``: idle processes wake on a commit instead of polling.
    notifies: ClassVar[bool] = False
    #: Row locks (``FOR UPDATE [SKIP LOCKED]``); without them one writer at a time.
    row_locks: ClassVar[bool] = True
    #: Claims and the database source read from where their last reads left off
    #: (``inbox.positions``). Off on every database for now: a claimer driven without the
    #: worker's hints (an engine used directly, as the integration tests do) leaves a row
    #: that became ready behind its position until its next read from the head. MariaDB ran
    #: the split reads at a third to a half of the speed of one read from the head.
    reads_from_positions: ClassVar[bool] = False
    #: Autocommit costs nothing (psycopg switches client-side): single statements that need
    #: no transaction spare the BEGIN, COMMIT and pool-reset round trips.
    cheap_autocommit: ClassVar[bool] = False
    #: A commit may skip the WAL flush (``synchronous_commit = off``).
    relaxed_commit: ClassVar[bool] = False
    #: The default isolation takes gap (next-key) locks on the ranges a statement reads
    #: (InnoDB's REPEATABLE READ): READ COMMITTED is asked for where that would stall.
    gap_locks: ClassVar[bool] = False
    #: A locking scan that waits (no SKIP LOCKED) beside other writers' updates can
    #: deadlock (InnoDB): such a scan is left out there.
    waiting_scan_deadlocks: ClassVar[bool] = False
    #: Zone-aware timestamps (TIMESTAMPTZ); elsewhere naive UTC is stored.
    aware_datetimes: ClassVar[bool] = False
    #: Array parameters (``= ANY(:ids)``): one statement text for any number of values,
    #: where an ``IN`` list is expanded into one parameter per value on every call.
    arrays: ClassVar[bool] = False
    #: A statement's ``WITH`` may hold ``INSERT``/``UPDATE ... RETURNING`` (data-modifying
    #: CTEs): reading, moving and marking rows can be one statement run by the server.
    writable_ctes: ClassVar[bool] = False
    #: Many rows can travel as ONE JSON array parameter (``jsonb_to_recordset``): a
    #: multi-row ``VALUES`` takes a parameter per column and row, which the driver parses
    #: again on every call.
    json_recordsets: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<dialect {self.family}>"

    # --- statements -------------------------------------------------------------------------

    def insert(self, table: Table) -> Any:
        """The family's INSERT construct (its ON CONFLICT / ON DUPLICATE KEY clauses)."""
        raise NotImplementedError

    def insert_or_ignore(self, table: Table, keys: Sequence[str]) -> Insert:
        """An INSERT whose duplicates on ``keys`` are skipped without an error."""
        stmt: Insert = self.insert(table).on_conflict_do_nothing(index_elements=list(keys))
        return stmt

    def upsert(self, table: Table, keys: Sequence[Any], set_: Mapping[str, Any]) -> Insert:
        """An INSERT whose duplicates on ``keys`` get ``set_`` instead of an error."""
        stmt: Insert = self.insert(table).on_conflict_do_update(
            index_elements=list(keys), set_=dict(set_)
        )
        return stmt

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        """``stmt`` locking the rows it returns, skipping rows locked by others."""
        return stmt.with_for_update(skip_locked=True) if self.row_locks else stmt

    def notify(self, channel: str, payload: str) -> Select[Any]:
        raise UnsupportedDatabaseError(f"{self.family}: no NOTIFY")

    def listen(self, channel: str) -> pg_sql.Composed:
        raise UnsupportedDatabaseError(f"{self.family}: no LISTEN")

    # --- engines ----------------------------------------------------------------------------

    def read_committed(self, engine: Engine) -> Engine:
        """The engine at READ COMMITTED where the default is stricter (see ``gap_locks``)."""
        return engine

    def reader(self, engine: Engine) -> Engine:
        """The engine for single statements that need no transaction (``cheap_autocommit``)."""
        return engine

    # --- group lock -------------------------------------------------------------------------

    def group_transaction(
        self, conn: Connection, scope: str, group: str | None, timeout: float
    ) -> Iterator[Connection | None]:
        """Body of ``inbox.engine.locks.group_transaction``: a transaction on ``conn`` holding the
        lock of (``scope``, ``group``), or just a transaction when ``group`` is None."""
        with conn.begin():
            yield conn

    def try_group_locks(
        self, conn: Connection, scope: str, groups: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """Take, without waiting and in one statement, the locks of ``groups`` inside the
        open transaction: the groups obtained, and the lock names to hand to
        ``release_group_locks`` after the commit (none where the commit releases them)."""
        return list(groups), []

    def release_group_locks(self, conn: Connection, names: Sequence[str]) -> None:
        return None

    # --- column types -----------------------------------------------------------------------

    def datetime_type(self) -> TypeEngine[Any]:
        return DateTime(timezone=True)

    def json_type(self) -> TypeEngine[Any]:
        return JSON()


class PostgreSQL(Dialect):
    family = "postgresql"
    async_driver = "postgresql+psycopg_async"
    notifies = True
    cheap_autocommit = True
    relaxed_commit = True
    aware_datetimes = True
    arrays = True
    writable_ctes = True
    json_recordsets = True

    def insert(self, table: Table) -> Any:
        return postgresql.insert(table)

    def notify(self, channel: str, payload: str) -> Select[Any]:
        """Delivered at commit; identical notifications of one transaction fold into one."""
        return select(func.pg_notify(channel, payload))

    def listen(self, channel: str) -> pg_sql.Composed:
        """``LISTEN <channel>`` for a raw psycopg connection, the channel quoted as an
        identifier (never pasted as text)."""
        from psycopg import sql as pg_sql  # here: a MariaDB or SQLite process never loads it

        return pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(channel))

    def reader(self, engine: Engine) -> Engine:
        return engine.execution_options(isolation_level="AUTOCOMMIT")

    def group_transaction(
        self, conn: Connection, scope: str, group: str | None, timeout: float
    ) -> Iterator[Connection | None]:
        if group is None:
            yield from super().group_transaction(conn, scope, group, timeout)
            return
        key = pg_lock_key(scope, group)
        transaction = conn.begin()
        try:
            if not conn.execute(pg_try_advisory_xact_lock(key)).scalar():
                if timeout <= 0:
                    transaction.rollback()
                    yield None
                    return
                conn.execute(pg_lock_timeout(max(1, int(timeout * 1000))))
                conn.execute(pg_advisory_xact_lock(key))
        except DBAPIError as exc:
            transaction.rollback()
            if getattr(exc.orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE:
                yield None
                return
            raise
        try:
            yield conn
        except BaseException:
            transaction.rollback()
            raise
        transaction.commit()

    def try_group_locks(
        self, conn: Connection, scope: str, groups: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        held = try_locks(conn, groups, [pg_lock_key(scope, g) for g in groups], try_locks_pg)
        return [g for g, _ in held], []

    def datetime_type(self) -> TypeEngine[Any]:
        return DateTime(timezone=True)

    def json_type(self) -> TypeEngine[Any]:
        return postgresql.JSONB()


class MySQL(Dialect):
    """MariaDB and MySQL."""

    family = "mysql"
    # aiomysql is PyMySQL's asyncio form: the same protocol code, error numbers and
    # rowcounts as the sync driver this project uses.
    async_driver = "mysql+aiomysql"
    returning = False
    gap_locks = True
    waiting_scan_deadlocks = True

    def insert(self, table: Table) -> Any:
        return mysql.insert(table)

    def insert_or_ignore(self, table: Table, keys: Sequence[str]) -> Insert:
        stmt: Insert = mysql.insert(table).prefix_with("IGNORE")
        return stmt

    def upsert(self, table: Table, keys: Sequence[Any], set_: Mapping[str, Any]) -> Insert:
        stmt: Insert = mysql.insert(table).on_duplicate_key_update(dict(set_))
        return stmt

    def read_committed(self, engine: Engine) -> Engine:
        """PostgreSQL's default level: each statement sees what others committed before it
        (a group lock holder's claim), and InnoDB takes no next-key locks on the ranges it
        reads, which under REPEATABLE READ deadlocked batches with other workers' ingest and
        claims."""
        return engine.execution_options(isolation_level=READ_COMMITTED)

    def group_transaction(
        self, conn: Connection, scope: str, group: str | None, timeout: float
    ) -> Iterator[Connection | None]:
        # READ COMMITTED: each read sees what the previous lock holder committed.
        # (REPEATABLE READ could check blockers against an older snapshot.)
        conn = conn.execution_options(isolation_level=READ_COMMITTED)
        if group is None:
            yield from super().group_transaction(conn, scope, group, timeout)
            return
        name = mysql_lock_name(scope, group)
        obtained = conn.execute(mysql_get_lock(name, timeout)).scalar()
        conn.commit()
        if obtained != 1:
            yield None
            return
        try:
            with conn.begin():
                yield conn
        finally:
            conn.execute(mysql_release_lock(name))
            conn.commit()

    def try_group_locks(
        self, conn: Connection, scope: str, groups: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        names = [mysql_lock_name(scope, g) for g in groups]
        held = try_locks(conn, groups, names, get_locks_mysql)
        return [g for g, _ in held], [n for _, n in held]

    def release_group_locks(self, conn: Connection, names: Sequence[str]) -> None:
        if names:
            conn.execute(release_locks_mysql(len(names)), lock_parameters(names))
            conn.commit()

    def datetime_type(self) -> TypeEngine[Any]:
        return mysql.DATETIME(fsp=6)


class SQLite(Dialect):
    family = "sqlite"
    async_driver = "sqlite+aiosqlite"
    row_locks = False

    def insert(self, table: Table) -> Any:
        return sqlite.insert(table)


POSTGRESQL = PostgreSQL()
MYSQL = MySQL()
SQLITE = SQLite()
_PORTABLE = Dialect()
_BY_NAME: dict[str, Dialect] = {
    "postgresql": POSTGRESQL,
    "mysql": MYSQL,
    "mariadb": MYSQL,
    "sqlite": SQLITE,
}


def dialect_of(bind: Bind) -> Dialect:
    """The seam object of ``bind``'s database. Unsupported databases are refused."""
    if isinstance(bind, SQLAlchemyDialect):
        name = bind.name
    elif isinstance(bind, Session):
        name = bind.connection().dialect.name
    else:
        name = bind.dialect.name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnsupportedDatabaseError(
            f"dialect {name!r} is not supported (PostgreSQL, MariaDB/MySQL, SQLite are)"
        ) from None


def column_types_of(dialect: SQLAlchemyDialect) -> Dialect:
    """``dialect_of`` for the column types, which SQLAlchemy also compiles on its generic
    dialect (``str(statement)``): an unknown dialect gets the portable types."""
    return _BY_NAME.get(dialect.name, _PORTABLE)


def by_family(family: str) -> Dialect:
    """The seam object of ``"postgresql"``, ``"mysql"`` or ``"sqlite"``."""
    return _BY_NAME[family]
