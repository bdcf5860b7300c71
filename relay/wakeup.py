"""How an idle relay learns that there is work: PostgreSQL LISTEN, or a plain timer.

``store()`` runs ``pg_notify(channel, queue)`` in the producer's transaction, so the
notification arrives when (and only if) the rows commit. Polling stays as the fallback: a
notification lost with a dropped connection costs at most one poll interval.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.engine import URL

from outbox.dialect import POSTGRESQL
from outbox.dsn import mask

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)


class Waker(Protocol):
    def drain(self) -> None:
        """Forget wake-ups that arrived before the fetch about to run (it will see them)."""

    def wait(self, timeout: float) -> bool:
        """Block until there may be work, ``timeout`` passes or the relay is stopped."""

    def close(self) -> None: ...


class PollWaker:
    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping

    def drain(self) -> None:
        return None

    def wait(self, timeout: float) -> bool:
        return self._stopping.wait(timeout)

    def close(self) -> None:
        return None


class PgNotifyWaker:
    """A dedicated autocommit connection that LISTENs; reconnects on the next wait if lost.

    psycopg is imported by each method: a relay on MariaDB or SQLite never loads it."""

    def __init__(self, url: URL, channel: str, stopping: threading.Event) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._channel = channel
        self._stopping = stopping
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def _connection(self) -> psycopg.Connection[tuple[object, ...]] | None:
        import psycopg

        if self._conn is None or self._conn.closed:
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5)
                conn.execute(POSTGRESQL.listen(self._channel))
                self._conn = conn
            except psycopg.Error as exc:
                log.warning("LISTEN unavailable, polling instead: %s", mask(str(exc)))
                self._conn = None
        return self._conn

    def drain(self) -> None:
        import psycopg

        conn = self._connection()
        if conn is None:
            return
        try:
            for _ in conn.notifies(timeout=0):
                pass
        except psycopg.Error:
            self.close()

    def wait(self, timeout: float) -> bool:
        import psycopg

        conn = self._connection()
        if conn is None:
            return self._stopping.wait(timeout)
        deadline = time.monotonic() + timeout
        try:
            # In slices, so a stop request (SIGTERM) is seen within a quarter second.
            while not self._stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                for _ in conn.notifies(timeout=min(remaining, 0.25), stop_after=1):
                    return True
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost: %s", mask(str(exc)))
            self.close()
        return self._stopping.is_set()

    def close(self) -> None:
        import psycopg

        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
