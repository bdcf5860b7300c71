"""What the operator commands do, without click: stats, failed rows, retry, republish, compact.

Each function takes an engine, the schema and ``now``; the CLI in ``outbox.ops.cli`` only
parses options and prints. All SQL comes from ``outbox.ops.queries``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Required, TypedDict, Unpack

from sqlalchemy import Engine, Select, Update

from outbox.ops import core
from outbox.ops import queries as q
from outbox.ops.core import Progress, locking_reads, no_progress
from outbox.ops.gauges import read_snapshot
from outbox.schema import Schema

__all__ = [
    "COMPACT_BATCH", "MAX_COMPACT_BATCH", "CompactResult", "ConsumerStats", "QueueStats",
    "RetryResult", "Stats", "compact", "count_compactable", "count_failed", "history",
    "list_failed", "locking_reads", "republish", "retry", "show", "stats",
]  # fmt: skip

COMPACT_BATCH = core.DELETE_BATCH
MAX_COMPACT_BATCH = core.MAX_DELETE_BATCH


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
    review: int = 0  # held for an operator (``outbox inbox review``)
    unknown: int = 0  # the handler's effect may or may not have happened
    halted_groups: int = 0  # groups held by a dead row (on_dead="halt"), counted in failed


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
                g.review if g else 0,
                g.unknown if g else 0,
                g.halted if g else 0,
            )
        )
    return Stats(queues, consumers)


def list_failed(
    engine: Engine,
    schema: Schema,
    *,
    limit: int = 100,
    offset: int = 0,
    **filters: Unpack[q.RowFilters],
) -> list[dict[str, Any]]:
    """Failed rows matching ``filters``, oldest id first; ``offset`` rows skipped (a page)."""
    stmt = q.list_failed(schema.outbox, limit=limit, offset=offset, **filters)
    return core.fetch_rows(engine, stmt)


def count_failed(engine: Engine, schema: Schema, **filters: Unpack[q.RowFilters]) -> int:
    """How many failed rows match ``filters`` (``list_failed``'s total)."""
    with engine.connect() as conn:
        return int(conn.execute(q.count_failed(schema.outbox, **filters)).scalar_one())


def history(engine: Engine, schema: Schema, row_id: int, limit: int = 50) -> list[dict[str, Any]]:
    """The audit records that name outbox row ``row_id``, newest first."""
    return core.audit_history(engine, schema.audit, "outbox", row_id, limit)


def show(engine: Engine, schema: Schema, row_id: int) -> dict[str, Any] | None:
    """One outbox row, whatever its status, with payload and headers decoded."""
    return core.fetch_row(engine, q.show_row(schema.outbox, row_id))


@dataclass(frozen=True)
class RetryResult:
    ids: list[int]  # put back to pending (or, with dry_run, that would be)
    not_matched: list[int]  # asked for by id but not in the status the command takes
    dry_run: bool


class Requeue(TypedDict, total=False):
    """The keyword arguments of ``retry`` and ``republish`` (besides republish's window):
    when, why and who (required); ``ids`` (default None: every row the filters match);
    the filters of ``list_failed`` (``queue``, ``type_``, ``error_like``, ``since``);
    ``dry_run`` (default False: change the rows); ``progress``."""

    now: Required[datetime]
    reason: Required[str]
    actor: Required[str]
    ids: Sequence[int] | None
    queue: str | None
    type_: str | None
    error_like: str | None
    since: datetime | None
    dry_run: bool
    progress: Progress


def retry(engine: Engine, schema: Schema, **request: Unpack[Requeue]) -> RetryResult:
    """Failed rows back to pending (attempts 0, due now) and one audit row, in one transaction.

    ``ids=None`` means every failed row matching the filters (``queue``, ``type_``,
    ``error_like``, ``since``: those of ``list_failed``). The rows are locked while read
    (SELECT ... FOR UPDATE; SQLite's write lock is taken at BEGIN) so the audit names
    exactly the rows this call changed.
    """
    t, now = schema.outbox, request["now"]
    filters = _filters(request)
    return _requeue(
        engine, schema, "retry", request,
        select_ids=lambda chunk: q.failed_ids(t, ids=chunk, **filters),
        update_rows=lambda chunk: q.retry_rows(t, chunk, now),
    )  # fmt: skip


def republish(
    engine: Engine,
    schema: Schema,
    *,
    sent_since: datetime | None = None,
    sent_until: datetime | None = None,
    **request: Unpack[Requeue],
) -> RetryResult:
    """Sent rows back to pending, due now, with one audit row: for messages a broker lost
    after confirming them. The relay publishes them again; a consumer that had them already
    counts a duplicate and does not run them twice (G3). ``ids=None`` needs ``sent_since``:
    republishing every sent row ever is never what an operator means."""
    if request.get("ids") is None and sent_since is None:
        raise ValueError("sent_since: give ids or the start of the window to republish")
    t, now = schema.outbox, request["now"]
    filters = _filters(request)
    return _requeue(
        engine, schema, "republish", request,
        select_ids=lambda chunk: q.sent_ids(
            t, ids=chunk, sent_since=sent_since, sent_until=sent_until, **filters
        ),
        update_rows=lambda chunk: q.republish_rows(t, chunk, now),
    )  # fmt: skip


def _filters(request: Requeue) -> q.RowFilters:
    return {
        "queue": request.get("queue"), "type_": request.get("type_"),
        "error_like": request.get("error_like"), "since": request.get("since"),
    }  # fmt: skip


def _requeue(
    engine: Engine,
    schema: Schema,
    action: str,
    request: Requeue,
    *,
    select_ids: Callable[[Sequence[int] | None], Select[Any]],
    update_rows: Callable[[Sequence[int]], Update],
) -> RetryResult:
    reason = request["reason"]
    dry_run = request.get("dry_run", False)
    core.check_reason(reason)
    with locking_reads(engine) as conn, conn.begin():
        ids = core.wanted_ids(request.get("ids"))
        found = core.select_locked(conn, ids, select_ids, dry_run)
        if dry_run or not found.ids:
            return RetryResult(found.ids, found.not_matched, dry_run)
        core.update_chunks(conn, found.ids, update_rows, request.get("progress", no_progress))
        core.insert_audit(
            conn, schema.audit, now=request["now"], actor=request["actor"], action=action,
            target="outbox", reason=reason, row_count=len(found.ids), row_ids=found.ids,
        )  # fmt: skip
    return RetryResult(found.ids, found.not_matched, dry_run)


CompactResult = core.DeleteResult


def count_compactable(engine: Engine, schema: Schema, before: datetime) -> int:
    with engine.connect() as conn:
        return int(conn.execute(q.count_compactable(schema.outbox, before)).scalar_one())


def compact(
    engine: Engine,
    schema: Schema,
    *,
    before: datetime,
    batch: int = COMPACT_BATCH,
    progress: Progress = no_progress,
    max_batches: int | None = None,
) -> CompactResult:
    """Delete sent rows with ``sent_at < before``, ``batch`` rows per short transaction.

    Pending and failed rows are never touched (the delete re-checks ``status = 'sent'`` and
    ``sent_at``).
    """
    t = schema.outbox
    return core.delete_in_batches(
        engine, q.compact_batch_ids(t, before, batch),
        lambda chunk: q.compact_delete(t, chunk, before),
        batch=batch, progress=progress, max_batches=max_batches,
    )  # fmt: skip
