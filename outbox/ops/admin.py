"""What the operator commands do, without click: stats, failed rows, retry, republish, compact.

Each function takes an engine, the schema and ``now``; the CLI in ``outbox.ops.cli`` only
parses options and prints. All SQL comes from ``outbox.ops.queries``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Select, Update

from outbox.metrics import read_snapshot
from outbox.ops import queries as q
from outbox.schema import Schema

# Ids per UPDATE/DELETE ... WHERE id IN (...): far under every driver's parameter limit.
ID_CHUNK = 1000
MAX_COMPACT_BATCH = 20000  # SQLite allows 32766 bound parameters per statement


@dataclass(frozen=True)
class QueueStats:
    queue: str
    priority: int
    pending: int
    oldest_pending_seconds: float
    failed: int
    sent_last_hour: int


@dataclass(frozen=True)
class ConsumerStats:
    consumer: str
    waiting: int
    processing: int
    failed: int
    duplicates: int
    longest_blocked_seconds: float


@dataclass(frozen=True)
class Stats:
    queues: list[QueueStats]
    consumers: list[ConsumerStats]

    def as_dict(self) -> dict[str, Any]:
        return {
            "queues": [asdict(s) for s in self.queues],
            "consumers": [asdict(s) for s in self.consumers],
        }


def stats(engine: Engine, schema: Schema, now: datetime) -> Stats:
    snap = read_snapshot(engine, schema, now)
    with engine.connect() as conn:
        sent = {
            (queue, int(priority)): int(rows)
            for queue, priority, rows in conn.execute(
                q.sent_since(schema.outbox, now - timedelta(hours=1))
            )
        }
        dups = {consumer: int(n) for consumer, n in conn.execute(q.inbox_duplicates(schema.inbox))}
    by_queue = {(g.queue, g.priority): g for g in snap.outbox}
    queues = []
    for queue, priority in sorted(set(by_queue) | set(sent)):
        o = by_queue.get((queue, priority))
        queues.append(
            QueueStats(
                queue,
                priority,
                o.pending if o else 0,
                o.pending_seconds if o else 0.0,
                o.failed if o else 0,
                sent.get((queue, priority), 0),
            )
        )
    by_consumer = {g.consumer: g for g in snap.inbox}
    consumers = []
    for consumer in sorted(set(by_consumer) | set(dups)):
        g = by_consumer.get(consumer)
        consumers.append(
            ConsumerStats(
                consumer,
                g.waiting if g else 0,
                g.processing if g else 0,
                g.failed if g else 0,
                dups.get(consumer, 0),
                g.blocked_seconds if g else 0.0,
            )
        )
    return Stats(queues, consumers)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (dict, list)):
        return value
    return str(value)  # UUIDs


def list_failed(
    engine: Engine,
    schema: Schema,
    *,
    queue: str | None = None,
    type_: str | None = None,
    error_like: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    stmt = q.list_failed(
        schema.outbox, queue=queue, type_=type_, error_like=error_like, since=since, limit=limit
    )
    with engine.connect() as conn:
        return [{k: _jsonable(v) for k, v in row._mapping.items()} for row in conn.execute(stmt)]


def show(engine: Engine, schema: Schema, row_id: int) -> dict[str, Any] | None:
    """One outbox row, whatever its status, with payload and headers decoded."""
    with engine.connect() as conn:
        row = conn.execute(q.show_row(schema.outbox, row_id)).first()
    if row is None:
        return None
    return {k: _jsonable(v) for k, v in row._mapping.items()}


@dataclass(frozen=True)
class RetryResult:
    ids: list[int]  # put back to pending (or, with dry_run, that would be)
    not_matched: list[int]  # asked for by id but not in the status the command takes
    dry_run: bool


def locking_reads(engine: Engine) -> Connection:
    """A connection for SELECT ... FOR UPDATE over a range the operator chose.

    MySQL/MariaDB: READ COMMITTED. Under InnoDB's default REPEATABLE READ a locking read locks
    every row and gap it scans, not only the rows that match: selecting failed or sent rows
    would hold the gaps where producers insert new pending rows and where the relay marks
    rows sent, stalling both until the operator's transaction ends (the relay runs READ
    COMMITTED for the same reason). PostgreSQL is READ COMMITTED already; SQLite has one
    writer whatever the level."""
    if engine.dialect.name in ("mysql", "mariadb"):
        return engine.connect().execution_options(isolation_level="READ COMMITTED")
    return engine.connect()


def _chunks(ids: Sequence[int], size: int = ID_CHUNK) -> list[Sequence[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def retry(
    engine: Engine,
    schema: Schema,
    *,
    now: datetime,
    reason: str,
    actor: str,
    ids: Sequence[int] | None = None,
    queue: str | None = None,
    type_: str | None = None,
    dry_run: bool = False,
    progress: Callable[[int], None] = lambda _n: None,
) -> RetryResult:
    """Failed rows back to pending (attempts 0, due now) and one audit row, in one transaction.

    ``ids=None`` means every failed row matching ``queue``/``type_``. The rows are locked
    while read (SELECT ... FOR UPDATE; SQLite's write lock is taken at BEGIN) so the audit
    names exactly the rows this call changed.
    """
    t = schema.outbox
    return _requeue(
        engine, schema, action="retry", now=now, reason=reason, actor=actor, ids=ids,
        select_ids=lambda chunk: q.failed_ids(t, ids=chunk, queue=queue, type_=type_),
        update_rows=lambda chunk: q.retry_rows(t, chunk, now),
        dry_run=dry_run, progress=progress,
    )  # fmt: skip


def republish(
    engine: Engine,
    schema: Schema,
    *,
    now: datetime,
    reason: str,
    actor: str,
    ids: Sequence[int] | None = None,
    sent_since: datetime | None = None,
    sent_until: datetime | None = None,
    queue: str | None = None,
    type_: str | None = None,
    dry_run: bool = False,
    progress: Callable[[int], None] = lambda _n: None,
) -> RetryResult:
    """Sent rows back to pending, due now, with one audit row: for messages a broker lost
    after confirming them. The relay publishes them again; a consumer that had them already
    counts a duplicate and does not run them twice (G3). ``ids=None`` needs ``sent_since``:
    republishing every sent row ever is never what an operator means."""
    if ids is None and sent_since is None:
        raise ValueError("sent_since: give ids or the start of the window to republish")
    t = schema.outbox
    return _requeue(
        engine, schema, action="republish", now=now, reason=reason, actor=actor, ids=ids,
        select_ids=lambda chunk: q.sent_ids(
            t, ids=chunk, sent_since=sent_since, sent_until=sent_until, queue=queue, type_=type_
        ),
        update_rows=lambda chunk: q.republish_rows(t, chunk, now),
        dry_run=dry_run, progress=progress,
    )  # fmt: skip


def _requeue(
    engine: Engine,
    schema: Schema,
    *,
    action: str,
    now: datetime,
    reason: str,
    actor: str,
    ids: Sequence[int] | None,
    select_ids: Callable[[Sequence[int] | None], Select[Any]],
    update_rows: Callable[[Sequence[int]], Update],
    dry_run: bool,
    progress: Callable[[int], None],
) -> RetryResult:
    if not reason.strip():
        raise ValueError("reason: must not be empty")
    wanted = sorted(set(ids)) if ids is not None else None
    with locking_reads(engine) as conn, conn.begin():
        found: list[int] = []
        for chunk in _chunks(wanted) if wanted is not None else [None]:
            stmt = select_ids(chunk)
            if not dry_run and conn.dialect.name != "sqlite":
                stmt = stmt.with_for_update()
            found.extend(int(i) for i in conn.execute(stmt).scalars())
        not_matched = sorted(set(wanted) - set(found)) if wanted is not None else []
        if dry_run or not found:
            return RetryResult(found, not_matched, dry_run)
        for chunk in _chunks(found):
            conn.execute(update_rows(chunk))
            progress(len(chunk))
        conn.execute(
            schema.audit.insert().values(
                at=now,
                actor=actor,
                action=action,
                target="outbox",
                reason=reason,
                row_count=len(found),
                row_ids=json.dumps(found),
            )
        )
    return RetryResult(found, not_matched, dry_run)


@dataclass(frozen=True)
class CompactResult:
    deleted: int
    batches: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.deleted / self.seconds if self.seconds > 0 else 0.0


def count_compactable(engine: Engine, schema: Schema, before: datetime) -> int:
    with engine.connect() as conn:
        return int(conn.execute(q.count_compactable(schema.outbox, before)).scalar_one())


def compact(
    engine: Engine,
    schema: Schema,
    *,
    before: datetime,
    batch: int = 10000,
    progress: Callable[[int], None] = lambda _n: None,
    max_batches: int | None = None,
) -> CompactResult:
    """Delete sent rows with ``sent_at < before``, ``batch`` rows per short transaction.

    Pending and failed rows are never touched (the delete re-checks ``status = 'sent'`` and
    ``sent_at``).
    """
    if not 1 <= batch <= MAX_COMPACT_BATCH:
        raise ValueError(f"batch: must be between 1 and {MAX_COMPACT_BATCH}, got {batch}")
    started = time.perf_counter()
    deleted = batches = 0
    while max_batches is None or batches < max_batches:
        with engine.begin() as conn:
            ids = [int(i) for i in conn.execute(
                q.compact_batch_ids(schema.outbox, before, batch)
            ).scalars()]  # fmt: skip
            if not ids:
                break
            n = 0
            for chunk in _chunks(ids):
                n += conn.execute(q.compact_delete(schema.outbox, chunk, before)).rowcount
        deleted += n
        batches += 1
        progress(n)
        if len(ids) < batch:
            break
    return CompactResult(deleted, batches, time.perf_counter() - started)
