"""The relay's next batch, fetched and locked while the broker confirms the current one.

Each batch is its own transaction on its own connection, holding its rows' locks until its
verdicts commit. While batch k waits for the broker, batch k+1 is fetched on a thread of its
own; it cannot hold a row of k (``SKIP LOCKED``), and it cannot hold a later row of a key
that has a row in k: k's rows are still committed-pending, which holds their keys' later
rows back in the fetch itself (``queries.fetch_due``). So a key's rows are never in two
in-flight batches, and a refusal in k still holds back its key's later rows (G10).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, RootTransaction, RowMapping

log = logging.getLogger("relay")


@dataclass
class OpenBatch:
    """A batch's rows, locked in their transaction until ``commit`` or ``rollback``."""

    conn: Connection
    transaction: RootTransaction
    rows: Sequence[RowMapping]

    def commit(self) -> None:
        try:
            self.transaction.commit()
        finally:
            self.conn.close()

    def rollback(self) -> None:
        """Give the rows back untouched (attempts unchanged); never raises: the connection
        may be the reason we are here."""
        try:
            self.transaction.rollback()
        except Exception as exc:  # a dead connection rolls back on the server anyway
            log.debug("rollback of an open batch failed: %s", exc)
        finally:
            self.conn.close()


def open_batch(engine: Engine, fetch: Callable[[Connection], Sequence[RowMapping]]) -> OpenBatch:
    """Begin a transaction and fetch (and lock) a batch in it."""
    conn = engine.connect()
    try:
        transaction = conn.begin()
        rows = fetch(conn)
    except BaseException:
        conn.close()  # rolls the transaction back
        raise
    return OpenBatch(conn, transaction, rows)


class Prefetcher:
    """At most one batch opened ahead of the current one, on a thread of its own."""

    def __init__(self, open_next: Callable[[], OpenBatch]) -> None:
        self._open_next = open_next
        self._pool: ThreadPoolExecutor | None = None
        self._next: Future[OpenBatch] | None = None

    def start(self) -> None:
        """Open the next batch now, unless one is open already."""
        if self._next is not None:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="relay-prefetch")
        self._next = self._pool.submit(self._open_next)

    def take(self) -> OpenBatch | None:
        """The batch opened ahead, once its fetch is done; None if none was started. A fetch
        that failed raises here, in the relay's loop, like a fetch of its own."""
        future, self._next = self._next, None
        return None if future is None else future.result()

    def drop(self) -> None:
        """Roll back the batch opened ahead (its rows were never published)."""
        future, self._next = self._next, None
        if future is None:
            return
        try:
            batch = future.result()
        except Exception:  # its fetch failed: nothing is open
            return
        batch.rollback()

    def close(self) -> None:
        self.drop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
