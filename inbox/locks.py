"""The group lock: one transaction per (consumer, group) at a time around [blockers + claim].

PostgreSQL: a transaction-scoped advisory lock on a namespaced 64-bit key, released by the
commit. MariaDB/MySQL: ``GET_LOCK`` on a hashed name with a timeout, taken before the
transaction and released after its commit (so the next holder sees the claim). SQLite: the
database write lock, taken by ``BEGIN IMMEDIATE`` (see ``outbox.dsn.make_engine``).
Not obtained in time: ``None`` is yielded and the caller tries later; nothing is raised.
See docs/locks.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from inbox import queries, rules
from outbox.queries import dialect_family

_PG_LOCK_NOT_AVAILABLE = "55P03"


@contextmanager
def group_transaction(
    engine: Engine, consumer: str, group: str | None, timeout: float
) -> Iterator[Connection | None]:
    """A transaction holding the group lock (or just a transaction when ``group`` is None).

    The body's statements commit when the block exits normally, roll back on an exception.
    ``timeout`` 0: only try (a claimer moves on to another candidate rather than queue
    behind a worker that is busy in this group right now).
    """
    with engine.connect() as conn:
        family = dialect_family(conn)
        if family == "mysql":
            # READ COMMITTED: each read sees what the previous lock holder committed.
            # (REPEATABLE READ could check blockers against an older snapshot.)
            conn = conn.execution_options(isolation_level="READ COMMITTED")
        if group is None or family == "sqlite":
            with conn.begin():
                yield conn
            return
        if family == "mysql":
            yield from _mysql(conn, rules.mysql_lock_name(consumer, group), timeout)
        else:
            yield from _postgresql(conn, rules.pg_lock_key(consumer, group), timeout)


def _mysql(conn: Connection, name: str, timeout: float) -> Iterator[Connection | None]:
    obtained = conn.execute(queries.mysql_get_lock(name, timeout)).scalar()
    conn.commit()
    if obtained != 1:
        yield None
        return
    try:
        with conn.begin():
            yield conn
    finally:
        conn.execute(queries.mysql_release_lock(name))
        conn.commit()


def _postgresql(conn: Connection, key: int, timeout: float) -> Iterator[Connection | None]:
    transaction = conn.begin()
    try:
        if not conn.execute(queries.pg_try_advisory_xact_lock(key)).scalar():
            if timeout <= 0:
                transaction.rollback()
                yield None
                return
            conn.execute(queries.pg_lock_timeout(max(1, int(timeout * 1000))))
            conn.execute(queries.pg_advisory_xact_lock(key))
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
