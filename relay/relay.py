"""The relay loop: fetch due rows, publish, record the broker's verdict, commit.

PostgreSQL / MariaDB: fetch ``FOR UPDATE SKIP LOCKED``, publish and mark in ONE transaction, so
the row locks keep other relays off the batch until the verdict is committed. A relay killed
between the broker's confirm and the commit leaves its rows pending: another relay publishes
them again (the at-least-once duplicate of G2, absorbed by the inbox).

SQLite: one relay per file (relay/sqlite_guard.py). The fetch and the marks are two short
transactions and the broker round trip happens between them, because a SQLite write lock held
while waiting for confirms would stall every producer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, RowMapping
from sqlalchemy.exc import SQLAlchemyError

from outbox import states
from outbox.backoff import outage_delay
from outbox.clock import utcnow
from outbox.dialect import READ_COMMITTED, dialect_of
from outbox.dsn import make_engine, mask
from outbox.metrics import Metrics
from outbox.schema import schema_for
from outbox.transport import BrokerUnavailable, Outgoing, Publisher
from outbox.validation import check_queue
from outbox.wire import Envelope, envelope_from_row
from relay import queries
from relay.key_order import chain, due_prefixes, waves
from relay.pipeline import Prefetcher, open_batch
from relay.settings import RelaySettings as RelaySettings
from relay.sqlite_guard import SQLiteRelayLock
from relay.wakeup import PgNotifyWaker, PollWaker, Waker

log = logging.getLogger("relay")
MAX_ERROR_LENGTH = 2000


@dataclass
class BatchResult:
    fetched: int = 0
    sent: int = 0
    refused: int = 0
    failed: int = 0


@dataclass
class RelayStats:
    batches: int = 0
    sent: int = 0
    refused: int = 0
    failed: int = 0
    broker_errors: int = 0
    database_errors: int = 0
    exit_reason: str = ""


class Relay:
    def __init__(
        self,
        engine: Engine,
        publisher: Publisher,
        settings: RelaySettings | None = None,
        *,
        clock: Callable[[], datetime] = utcnow,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings or RelaySettings()
        self.publisher = publisher
        self.clock = clock
        # A registry of its own unless told otherwise: several relays in one test process.
        self.metrics = metrics if metrics is not None else Metrics()
        self.table = schema_for(self.settings.config).outbox
        self.dialect = dialect_of(engine)
        if self.dialect.gap_locks:
            # No gap locks: under REPEATABLE READ the batch's FOR UPDATE would lock the gap
            # producers insert into, stalling them for a whole broker round trip. An engine of
            # our own at that level, not execution_options on the caller's: the pool would
            # reset the level on check-in, and on a connection the server killed that raises
            # outside SQLAlchemy's error handling.
            engine = make_engine(engine.url, isolation_level=READ_COMMITTED)
        self.engine = engine
        self.stats = RelayStats()
        self._prefetcher = Prefetcher(lambda: open_batch(self.engine, self._fetch_locked))
        self._stopping = threading.Event()
        self._connected = False

    # -- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the current batch, then return from ``run()``. Not from a signal handler:
        it sets an event the run loop waits on (``outbox.stop_signals`` says why)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> RelayStats:
        """Relay until stopped, idle (``stop_when_idle``) or a limit is reached."""
        s = self.settings
        guard = self._sqlite_guard()
        waker = self._waker()
        started = time.monotonic()
        broker_failures = db_failures = 0
        try:
            while not self.stopping:
                if s.time_limit is not None and time.monotonic() - started >= s.time_limit:
                    self.stats.exit_reason = "time limit"
                    break
                if s.max_messages is not None and self.stats.sent >= s.max_messages:
                    self.stats.exit_reason = "max messages"
                    break
                waker.drain()
                try:
                    result = self.run_once(prefetch=s.pipeline)
                except BrokerUnavailable as exc:
                    broker_failures += 1
                    self.stats.broker_errors += 1
                    # An outage belongs to no queue: counted with empty labels.
                    self.metrics.publish_errors("", 0)
                    self._pause(exc, broker_failures, "broker")
                    continue
                except SQLAlchemyError as exc:
                    # DBAPIError, and the errors SQLAlchemy raises about a connection that died
                    # mid-transaction (PendingRollbackError, ResourceClosedError ...).
                    db_failures += 1
                    self.stats.database_errors += 1
                    self._pause(exc, db_failures, "database")
                    continue
                broker_failures = db_failures = 0
                if result.fetched == 0:
                    if s.stop_when_idle:
                        self.stats.exit_reason = "idle"
                        break
                    self.publisher.idle()
                    waker.wait(s.poll_interval)
            else:
                self.stats.exit_reason = "stopped"
        finally:
            self._prefetcher.close()
            waker.close()
            self.publisher.close()
            self._connected = False
            if guard is not None:
                guard.release()
        return self.stats

    def run_once(self, *, prefetch: bool = False) -> BatchResult:
        """One batch: fetch, publish, record. Raises ``BrokerUnavailable`` or a SQLAlchemy error
        after rolling back (attempts untouched). ``prefetch`` (``run()`` only, which rolls
        back what is left open when it ends): after a full batch, the next one is fetched and
        locked while this one is published, and the next call publishes it."""
        started = time.perf_counter()
        if not self._connected:
            self.publisher.connect()
            self._connected = True
            if self.stats.broker_errors:  # the operator sees when an outage ended
                log.info("broker connected again (%d errors so far)", self.stats.broker_errors)
        try:
            if self.dialect.row_locks:
                result = self._locked_batch(prefetch)
            else:
                result = self._sqlite_batch()
        except BrokerUnavailable:
            self._connected = False
            raise
        elapsed = time.perf_counter() - started
        if result.fetched:
            self.stats.batches += 1
            self.stats.sent += result.sent
            self.stats.refused += result.refused
            self.stats.failed += result.failed
            self.metrics.relay_batch(elapsed)
            log.info(
                "batch: %d published, %d refused (%d now failed) in %.1f ms; errors so far: "
                "%d broker, %d database",
                result.sent,
                result.refused,
                result.failed,
                elapsed * 1000,
                self.stats.broker_errors,
                self.stats.database_errors,
            )
        return result

    # -- one batch ----------------------------------------------------------------------------

    def _locked_batch(self, prefetch: bool) -> BatchResult:
        batch = self._prefetcher.take()
        if batch is not None and not batch.rows:
            # Fetched while the previous batch held its keys back: not a sign of idleness,
            # now that it committed.
            batch.rollback()
            batch = None
        if batch is None:
            batch = open_batch(self.engine, self._fetch_locked)
        try:
            if not batch.rows:
                batch.rollback()
                return BatchResult()
            if prefetch and len(batch.rows) >= self.settings.batch_size:
                self._prefetcher.start()
            outcome = self._publish(batch.rows)
            result = self._record(batch.conn, batch.rows, outcome, self.clock())
        except BaseException:
            batch.rollback()
            # The broker (or the database) failed: the batch opened ahead is given back too,
            # unpublished, and the loop's pause applies to both.
            self._prefetcher.drop()
            raise
        batch.commit()
        return result

    def _fetch_locked(self, conn: Connection) -> Sequence[RowMapping]:
        rows = self._fetch(conn, self.clock(), lock=True)
        if rows and self.dialect.relaxed_commit:
            conn.execute(queries.relaxed_commit())
        return rows

    def _sqlite_batch(self) -> BatchResult:
        with self.engine.begin() as conn:
            rows = self._fetch(conn, self.clock(), lock=False)
        if not rows:
            return BatchResult()
        outcome = self._publish(rows)
        with self.engine.begin() as conn:
            return self._record(conn, rows, outcome, self.clock())

    def _fetch(self, conn: Connection, now: datetime, *, lock: bool) -> Sequence[RowMapping]:
        """The heads (one row per key, plus rows without key), then, while the batch has
        room, the rows queued behind those heads: a hot key still moves a batch at a time."""
        limit = self.settings.batch_size
        stmt = queries.fetch_due(self.table, limit=limit, queues=self.settings.queues, lock=lock)
        rows = list(conn.execute(stmt, {"now": now}).mappings().all())
        heads = [
            (r["queue"], r["priority"], r["key"], r["id"]) for r in rows if r["key"] is not None
        ]
        if not heads or len(rows) >= limit:
            return rows
        if self.dialect.waiting_scan_deadlocks:
            # InnoDB: the followers' locking scan (no SKIP LOCKED, on purpose) waits on index
            # records another relay's mark-sent UPDATE holds while that UPDATE waits on ours:
            # a deadlock (1213) whose victim may be an already-published batch, which would
            # then be published twice. On MariaDB a key moves one row per batch instead.
            return rows
        followers = (
            conn.execute(
                queries.fetch_followers(self.table, heads, limit=limit - len(rows), lock=lock)
            )
            .mappings()
            .all()
        )
        rows += due_prefixes(followers, now)
        rows.sort(key=lambda r: (r["priority"], r["id"]))
        return rows

    def _publish(self, rows: Sequence[RowMapping]) -> dict[int, str | None]:
        """Publish in waves: wave n holds the n-th row of every key (and wave 0 the rows
        without key); a key's next row goes out only after its previous one was confirmed, so
        a refusal never lets a later row of its key reach the broker first. One wave per
        publish() call: with many keys a wave is large, with one hot key it is one message
        per confirm round trip. Returns row id -> None (confirmed) or the refusal; rows
        held back behind a refusal are absent."""
        outcome: dict[int, str | None] = {}
        refused_chains: set[tuple[str, int, str]] = set()
        for wave in waves(rows):
            batch: list[Outgoing] = []
            for row in wave:
                if refused_chains and row["key"] is not None and chain(row) in refused_chains:
                    continue
                try:
                    batch.append(Outgoing(row["id"], envelope_of(row)))
                except (TypeError, ValueError) as exc:
                    outcome[row["id"]] = f"cannot build the message: {exc}"
            verdicts: Mapping[int, str | None] = self.publisher.publish(batch) if batch else {}
            for item in batch:
                outcome[item.row_id] = verdicts.get(item.row_id, "no verdict from the publisher")
            for row in wave:
                if row["key"] is not None and outcome.get(row["id"]) is not None:
                    refused_chains.add(chain(row))
        return outcome

    def _record(
        self,
        conn: Connection,
        rows: Sequence[RowMapping],
        outcome: Mapping[int, str | None],
        now: datetime,
    ) -> BatchResult:
        result = BatchResult(fetched=len(rows))
        # Rows not in ``outcome`` were never sent: an earlier row of their key was refused in
        # this batch, so they stay pending, untouched, behind it.
        confirmed = [row for row in rows if row["id"] in outcome and outcome[row["id"]] is None]
        if confirmed:
            mark = queries.mark_sent(self.table, arrays=self.dialect.arrays)
            conn.execute(mark, {"ids": [row["id"] for row in confirmed], "now": now})
            result.sent = len(confirmed)
            lags: dict[tuple[str, int], list[float]] = {}
            for row in confirmed:
                lag = (now - row["occurred_at"]).total_seconds()
                lags.setdefault((row["queue"], row["priority"]), []).append(lag)
            for (queue, priority), seconds in lags.items():
                self.metrics.delivered(queue, priority, seconds)
        for row in rows:
            reason = outcome.get(row["id"])
            if reason is None:
                continue
            attempts = row["attempts"] + 1
            dead = attempts >= self.settings.max_attempts
            conn.execute(
                queries.mark_refused(
                    self.table,
                    row["id"],
                    attempts_before=row["attempts"],
                    attempts=attempts,
                    status=states.FAILED if dead else states.PENDING,
                    available_at=now if dead else now + self.settings.backoff.delay(attempts),
                    error=mask(reason)[:MAX_ERROR_LENGTH],
                )
            )
            self.metrics.publish_errors(row["queue"], row["priority"])
            result.refused += 1
            result.failed += int(dead)
            log.warning(
                "row %d (%s) refused, attempt %d/%d%s: %s",
                row["id"],
                row["event_id"],
                attempts,
                self.settings.max_attempts,
                " -> failed" if dead else "",
                reason,
            )
        return result

    # -- helpers ------------------------------------------------------------------------------

    def _pause(self, exc: Exception, failures: int, what: str) -> None:
        delay = outage_delay(failures, self.settings.outage_cap_seconds)
        log.warning(
            "%s unavailable (%d in a row), batch rolled back, retrying in %.0f s: %s",
            what,
            failures,
            delay,
            mask(str(exc).splitlines()[0] if str(exc) else type(exc).__name__),
        )
        self._stopping.wait(delay)

    def _sqlite_guard(self) -> SQLiteRelayLock | None:
        if self.dialect.row_locks:
            return None
        guard = SQLiteRelayLock(self.engine.url.database)
        guard.acquire()
        return guard

    def _waker(self) -> Waker:
        if self.dialect.notifies and self.settings.use_notify:
            return PgNotifyWaker(
                self.engine.url, self.settings.config.notify_channel, self._stopping
            )
        return PollWaker(self._stopping)


def envelope_of(row: RowMapping) -> Envelope:
    # A row stored before store() checked broker name limits (or written by hand) is refused
    # here, with the reason: a name the broker cannot take can close the channel or, for a
    # trailing newline, hang RabbitMQ's queue.declare.
    check_queue(row["queue"])
    return envelope_from_row(row)


__all__ = ["BatchResult", "Relay", "RelaySettings", "RelayStats"]
