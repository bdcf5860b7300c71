"""The database source: no broker, the worker takes committed outbox rows itself.

One transaction: lock due pending rows of our queues (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL and MariaDB; SQLite's ``BEGIN IMMEDIATE`` makes us the only writer), ingest them
into the inbox, mark them sent. Commit. Each outbox row goes to exactly one consumer: the
database source is a work queue; several consumers of one queue need a broker.
PostgreSQL wakes on the NOTIFY that ``outbox.store()`` sends on commit; elsewhere it polls.

On PostgreSQL (``Dialect.writable_ctes``) the whole take is ONE statement that the server
runs (``inbox.sql.ingest.take_into_inbox``): the rows never come to the worker, which halved
the worker's CPU per message. Elsewhere the rows are read, handed to ``InboxIngest.within``
and marked, in one transaction. Where the dialect reads from positions
(``Dialect.reads_from_positions``, off everywhere today), takes read from where the last
ones left off (``inbox.positions``) through that second path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Table

from inbox.ingest import InboxIngest, IngestResult, unknown_type_suffix, wake_payload
from inbox.positions import LookBack, ScanPositions, Seen
from inbox.sql import ingest as queries
from inbox.sql.predicates import point_shape, settled
from outbox.clock import utcnow
from outbox.dialect import dialect_of
from outbox.schema import schema_for
from outbox.transport import Ingest
from outbox.wire import envelope_from_row

log = logging.getLogger("inbox.sources.database")

# How often a take reads the pending rows from the head of the range rather than from where
# the last takes left off: the longest a row committed behind a position (a producer's
# transaction that committed after later ones, an operator's retry) waits.
FROM_HEAD_EVERY = timedelta(seconds=5)
# Without notifications (MariaDB, SQLite) nothing says when such a row came: a take that
# finds nothing from the positions reads from the head at most this often.
LOOK_BACK_EVERY = timedelta(seconds=1)


class DatabaseSource:
    def __init__(
        self,
        engine: Engine,
        queues: Sequence[str],
        *,
        ingest_within: InboxIngest | None = None,
        wake: threading.Event | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.engine = engine
        self.dialect = dialect_of(engine)
        self._single = self.dialect.reader(engine)  # a take in one statement needs no BEGIN
        self.queues = list(queues)
        self.clock = clock
        # Set by the worker's listener on a NOTIFY; polled otherwise.
        self._wake = wake if wake is not None else threading.Event()
        self._ingest = ingest_within
        self._closed = False
        self._positions = ScanPositions()
        self._look_back = LookBack()
        self._from_head_due: datetime | None = None  # the first take reads from the head
        self._last_from_head: datetime | None = None

    def run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        target = ingest if isinstance(ingest, InboxIngest) else self._ingest
        if target is None:
            raise TypeError("DatabaseSource needs an InboxIngest (it ingests in its transaction)")
        taken = self._take(target, max_messages)
        if taken or self._closed:
            return taken
        # Nothing due: wait for a NOTIFY (PostgreSQL) or the poll interval, then look again.
        if self._wake.wait(timeout):
            self._wake.clear()
            self._look_back.want()  # a commit: maybe of a row behind the positions
            return self._take(target, max_messages)
        return 0

    def _take(self, target: InboxIngest, limit: int) -> int:
        if self.dialect.writable_ctes and not self.dialect.reads_from_positions:
            return self._take_in_database(target, limit)
        outbox = schema_for(target.consumer.config).outbox
        with self.engine.begin() as conn:
            now = self.clock()
            rows, from_start = self._pending(conn, outbox, now, limit)
            if not rows:
                return 0
            result = target.within(conn, [envelope_from_row(r._mapping) for r in rows])
            conn.execute(queries.mark_outbox_sent(outbox, [r.id for r in rows], now))
        # Learnt after the commit: a rolled-back take leaves its rows pending for the next.
        if self.dialect.reads_from_positions:
            seen = (Seen(r.priority, r.id) for r in rows)
            self._positions.learn(seen, from_start=from_start, full=len(rows) >= limit)
        if target.on_ingested is not None:
            target.on_ingested(result)
        return len(rows)

    def _take_in_database(self, target: InboxIngest, limit: int) -> int:
        """The take as one statement that the server runs (``queries.take_into_inbox``):
        the rows never come to this process. One statement is its own transaction."""
        consumer = target.consumer
        schema = schema_for(consumer.config)
        statement = queries.take_into_inbox(schema.outbox, schema.inbox, schema.inbox_sequences)
        parameters = queries.take_parameters(
            self.queues,
            self.clock(),
            limit,
            consumer.name,
            consumer.types,
            unknown_type_suffix(consumer),
            consumer.config.notify_channel,
            wake_payload(consumer),
        )
        with self._single.connect() as conn:
            row = conn.execute(statement, parameters).one()
        taken = int(row.taken)
        if taken and target.on_ingested is not None:
            target.on_ingested(
                IngestResult(int(row.inserted), int(row.duplicates), int(row.failed))
            )
        return taken

    def _pending(
        self, conn: Connection, outbox: Table, now: datetime, limit: int
    ) -> tuple[Sequence[Any], bool]:
        """Pending rows to take, and whether they were read from the head of the range: once
        per ``FROM_HEAD_EVERY``, and when a read from the positions finds nothing after a
        wake (a NOTIFY) or, without notifications, ``LOOK_BACK_EVERY`` after the last read
        from the head (see ``inbox.positions``)."""
        points = self._positions.points() if self.dialect.reads_from_positions else ()
        if self._from_head_due is None or now >= self._from_head_due:
            self._from_head_due = now + FROM_HEAD_EVERY
            points = ()
        wanted = self._look_back.wanted()
        self._look_back.answer(wanted)  # by this take, whatever it finds
        look_back = bool(wanted) or self._look_back_due(now)
        shape = point_shape(points)
        values = queries.pending_parameters(self.queues, now, limit, points)
        statement = queries.pending_outbox(outbox, self.dialect, shape)
        rows: list[Any] = list(conn.execute(statement, values).all())
        if not settled(rows, limit, points):
            statement = queries.pending_outbox(outbox, self.dialect, shape, rest=True)
            rows += conn.execute(statement, values).all()
            rows = sorted(rows, key=lambda r: (r.priority, r.id))[:limit]
        if points and not rows and look_back:
            statement = queries.pending_outbox(outbox, self.dialect)
            values = queries.pending_parameters(self.queues, now, limit)
            rows, points = list(conn.execute(statement, values).all()), ()
        if not points:
            self._last_from_head = now
        return rows, not points

    def _look_back_due(self, now: datetime) -> bool:
        if self.dialect.notifies:
            return False
        last = self._last_from_head
        return last is None or now - last >= LOOK_BACK_EVERY

    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
