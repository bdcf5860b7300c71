"""The group lock: one transaction per (consumer, group) at a time around [blockers + claim].

How each database takes it is the dialect seam's (``outbox.dialect``): an advisory lock on
PostgreSQL, ``GET_LOCK`` on MariaDB/MySQL, the database write lock on SQLite. Not obtained
in time: ``None`` is yielded and the caller tries later; nothing is raised.
See docs/locks.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine

from outbox.dialect import dialect_of


@contextmanager
def group_transaction(
    engine: Engine, consumer: str, group: str | None, timeout: float
) -> Iterator[Connection | None]:
    """A transaction holding the group lock (or just a transaction when ``group`` is None).

    The body's statements commit when the block exits normally, roll back on an exception.
    ``timeout`` 0: only try (a claimer moves on to another candidate rather than queue
    behind a worker that is busy in this group right now).
    """
    dialect = dialect_of(engine)
    with engine.connect() as conn:
        yield from dialect.group_transaction(conn, consumer, group, timeout)
