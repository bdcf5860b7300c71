"""What ``outbox inbox failed | retry | unblock | prune`` do, without click.

Each function takes an engine, the config (table names) and ``now``; ``inbox.cli.ops`` only
parses options and prints. All SQL comes from ``inbox.ops.queries``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Unpack

from sqlalchemy import Connection, Engine, Table

from inbox.consumer import Consumer
from inbox.engine.heads import HeadPass
from inbox.engine.marks import mark_groups
from inbox.ingest import wake_payload
from inbox.ops import queries as q
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.dialect import dialect_of
from outbox.ops import core
from outbox.ops.core import Progress, locking_reads, no_progress
from outbox.ops.queries import for_update
from outbox.schema import schema_for

log = logging.getLogger("inbox.ops")

PRUNE_BATCH = core.DELETE_BATCH
MAX_PRUNE_BATCH = core.MAX_DELETE_BATCH
# Rows per audit record: each keeps its row's last_error (up to AUDIT_ERROR_CHARS), so a
# record stays well under MariaDB's max_allowed_packet (16 MiB by default).
AUDIT_CHUNK = 200
AUDIT_ERROR_CHARS = 4000


# ---- failed --------------------------------------------------------------------------------


def list_failed(
    engine: Engine,
    *,
    config: OutboxConfig = DEFAULT_CONFIG,
    limit: int = 100,
    offset: int = 0,
    **filters: Unpack[q.DeadFilters],
) -> list[dict[str, Any]]:
    """Dead rows (``failed`` and ``halted``), oldest id first; ``offset`` rows skipped."""
    stmt = q.list_dead(schema_for(config).inbox, limit=limit, offset=offset, **filters)
    return core.fetch_rows(engine, stmt)


def count_failed(
    engine: Engine, *, config: OutboxConfig = DEFAULT_CONFIG, **filters: Unpack[q.DeadFilters]
) -> int:
    """How many dead rows match ``filters`` (``list_failed``'s total)."""
    with engine.connect() as conn:
        return int(conn.execute(q.count_dead(schema_for(config).inbox, **filters)).scalar_one())


def history(
    engine: Engine, row_id: int, *, config: OutboxConfig = DEFAULT_CONFIG, limit: int = 50
) -> list[dict[str, Any]]:
    """The audit records that name inbox row ``row_id`` (retry, unblock, resolve), newest
    first."""
    return core.audit_history(engine, schema_for(config).audit, "inbox", row_id, limit)


def show(
    engine: Engine, row_id: int, *, config: OutboxConfig = DEFAULT_CONFIG
) -> dict[str, Any] | None:
    """One inbox row whatever its state, payload and headers decoded."""
    return core.fetch_row(engine, q.show_row(schema_for(config).inbox, row_id))


# ---- retry ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupRef:
    consumer: str
    group: str
    row_id: int  # the halted row


@dataclass(frozen=True)
class RetryResult:
    ids: list[int]  # retried (with dry_run: that would be)
    not_retried: list[int]  # asked for by --id but not dead (missing, or outside the filters)
    # Groups halted by a row of ``ids``: retrying the row released them, in order.
    released: list[GroupRef]
    # Groups of retried rows still halted by another row: the retried rows wait behind it.
    still_halted: list[GroupRef]
    dry_run: bool
    promoted: int = 0  # released groups whose head was made ready at once
    notes: list[str] = field(default_factory=list)


def retry(
    engine: Engine,
    *,
    now: datetime,
    reason: str,
    actor: str,
    config: OutboxConfig = DEFAULT_CONFIG,
    ids: Sequence[int] | None = None,
    consumer: str | None = None,
    type_: str | None = None,
    group: str | None = None,
    error_like: str | None = None,
    since: datetime | None = None,
    dry_run: bool = False,
    progress: Progress = no_progress,
) -> RetryResult:
    """Dead (``failed`` or ``halted``) rows back to ``ready``, in one transaction with their
    audit records.

    ``ids=None``: every dead row matching the filters (those of ``list_failed``). The rows
    are locked while read (SELECT ... FOR UPDATE; on SQLite the write lock is taken at BEGIN
    IMMEDIATE), and each UPDATE is conditional on the state read, so the audit names exactly
    the rows this call changed.
    A retried row goes back in line by its (priority, seq): claims re-check every blocker, so
    no group lock is needed here (the retry never starts a row). A halted row retried
    releases its group with the row in its place: it runs before the messages it held back.
    """
    core.check_reason(reason)
    schema = schema_for(config)
    with locking_reads(engine) as conn, conn.begin():
        found = core.select_locked(
            conn, core.wanted_ids(ids),
            lambda chunk: q.dead_rows(
                schema.inbox, ids=chunk, consumer=consumer, type_=type_, group=group,
                error_like=error_like, since=since,
            ),
            dry_run,
        )  # fmt: skip
        released, still_halted = _halted_groups(conn, schema.inbox, found.rows, consumer)
        if dry_run or not found.rows:
            return RetryResult(found.ids, found.not_matched, released, still_halted, dry_run)
        for state in q.DEAD_STATES:
            of_state = [int(r.id) for r in found.rows if r.state == state]
            update = partial(q.retry_rows, schema.inbox, state=state, now=now)
            core.update_chunks(conn, of_state, update, progress)
        for chunk in core.chunks(found.rows, AUDIT_CHUNK):
            _audit(conn, schema.audit, chunk, now, actor, reason)
        _mark_for_head_pass(conn, schema.groups, found.rows)
        _wake_workers(conn, config, found.rows)
    promoted, notes = _promote(engine, config, released)
    return RetryResult(
        found.ids, found.not_matched, released, still_halted, dry_run, promoted=promoted,
        notes=notes,
    )  # fmt: skip


def _wake_workers(conn: Connection, config: OutboxConfig, rows: Sequence[Any]) -> None:
    """PostgreSQL: NOTIFY the consumers of ``rows`` at commit, so their workers look now."""
    if not dialect_of(conn).notifies:
        return
    for name in sorted({str(r.consumer) for r in rows}):
        stub = Consumer(name, queues=["retry"], config=config)
        conn.execute(q.notify(config.notify_channel, wake_payload(stub)))


def _audit(
    conn: Connection,
    audit: Table,
    rows: Sequence[Any],
    now: datetime,
    actor: str,
    reason: str,
    action: str = "retry",
) -> None:
    """One audit record: target ``inbox``; ``row_ids`` lists, per row, what the retry erased
    or will overwrite: its state, attempts and last_error."""
    detail = [
        {
            "id": int(r.id),
            "state": r.state,
            "attempts": int(r.attempts),
            "last_error": (r.last_error or "")[-AUDIT_ERROR_CHARS:] or None,
        }
        for r in rows
    ]
    core.insert_audit(
        conn, audit, now=now, actor=actor, action=action, target="inbox", reason=reason,
        row_count=len(rows), row_ids=detail,
    )  # fmt: skip


# ---- unblock -------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnblockResult:
    halted_by: int | None  # the row that halted the group, now failed (dry run: would be)
    dry_run: bool
    promoted: int = 0  # 1 when the group's next message was made ready at once
    notes: list[str] = field(default_factory=list)


def unblock(
    engine: Engine,
    *,
    now: datetime,
    reason: str,
    actor: str,
    consumer: str,
    group: str,
    config: OutboxConfig = DEFAULT_CONFIG,
    dry_run: bool = False,
) -> UnblockResult:
    """Let a group halted by a dead message (``on_dead="halt"``) go on without it: the halted
    row becomes ``failed`` (``retry`` runs it again later), with an audit record keeping its
    attempts and last_error, in one transaction; then the group's next message is made ready.
    ``inbox.unblock`` is the same without the audit record, for code."""
    core.check_reason(reason)
    schema = schema_for(config)
    table = schema.inbox
    with locking_reads(engine) as conn, conn.begin():
        stmt = for_update(q.halted_in_group(table, consumer, group), conn, not dry_run)
        # A halted row holds its group, so a group has one at most.
        row = conn.execute(stmt).first()
        if dry_run or row is None:
            return UnblockResult(None if row is None else int(row.id), dry_run)
        conn.execute(q.unblock_row(table, consumer, group, int(row.id)))
        _audit(conn, schema.audit, [row], now, actor, reason, "unblock")
        _mark_for_head_pass(conn, schema.groups, [row])
    promoted, notes = _promote(engine, config, [GroupRef(consumer, group, int(row.id))])
    return UnblockResult(int(row.id), dry_run, promoted, notes)


def _halted_groups(
    conn: Connection, table: Table, found: Sequence[Any], consumer: str | None
) -> tuple[list[GroupRef], list[GroupRef]]:
    """Which groups of ``found`` this retry releases, and which stay halted by another row."""
    chosen = {int(r.id) for r in found}
    halted = {
        (str(h.consumer), str(h.serial_group)): int(h.id)
        for h in conn.execute(q.halted_rows(table, consumer))
        if h.serial_group is not None
    }
    released: list[GroupRef] = []
    still: list[GroupRef] = []
    seen: set[tuple[str, str]] = set()
    for r in found:
        if r.serial_group is None:
            continue
        key = (str(r.consumer), str(r.serial_group))
        holder = halted.get(key)
        if holder is None or key in seen:
            continue
        seen.add(key)
        (released if holder in chosen else still).append(GroupRef(key[0], key[1], holder))
    return released, still


def _mark_for_head_pass(conn: Connection, groups: Table, rows: Sequence[Any]) -> None:
    """The groups these rows free or put back in line: if ``_promote`` cannot promote one
    now, the workers' head pass finds it marked."""
    by_consumer: dict[str, set[str]] = {}
    for r in rows:
        if r.serial_group is not None:
            by_consumer.setdefault(str(r.consumer), set()).add(str(r.serial_group))
    for consumer in sorted(by_consumer):
        mark_groups(conn, groups, consumer, by_consumer[consumer])


def _promote(
    engine: Engine, config: OutboxConfig, released: Sequence[GroupRef]
) -> tuple[int, list[str]]:
    """After the commit: make each released group's head ready now (if a more urgent message
    arrived while it was halted, that one is the head). Best effort: the workers' periodic
    head-of-group pass does the same within seconds."""
    promoted = 0
    notes: list[str] = []
    for ref in released:
        stub = Consumer(ref.consumer, queues=["retry"], config=config)
        try:
            if HeadPass(stub, engine, job_queue=False).promote_group(ref.group):
                promoted += 1
        except Exception as exc:  # committed already: say so, never undo the retry
            log.warning("group %r not promoted: %s", ref.group, exc)
            notes.append(f"group {ref.group!r}: head not promoted now ({exc}); workers will")
    return promoted, notes


# ---- prune ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PruneResult(core.DeleteResult):
    groups_forgotten: int = 0  # inbox_groups rows with nothing to check, deleted


def count_prunable(
    engine: Engine,
    before: datetime,
    *,
    consumer: str | None = None,
    config: OutboxConfig = DEFAULT_CONFIG,
) -> int:
    with engine.connect() as conn:
        stmt = q.count_prunable(schema_for(config).inbox, before, consumer)
        return int(conn.execute(stmt).scalar_one())


def prune(
    engine: Engine,
    before: datetime,
    *,
    consumer: str | None = None,
    batch: int = PRUNE_BATCH,
    config: OutboxConfig = DEFAULT_CONFIG,
    progress: Progress = no_progress,
    max_batches: int | None = None,
) -> PruneResult:
    """Delete ``done`` rows finished before ``before``, ``batch`` rows per short transaction;
    then the ``inbox_groups`` rows not marked for the head pass (a group per order id would
    otherwise leave one row per order for ever; the next change of the group writes it
    again, marked).

    Never failed, halted or unfinished rows: the delete re-checks ``state = 'done'``.
    """
    schema = schema_for(config)
    table = schema.inbox
    done = core.delete_in_batches(
        engine, q.prune_batch_ids(table, before, consumer, batch),
        lambda chunk: q.prune_delete(table, chunk, before),
        batch=batch, progress=progress, max_batches=max_batches,
    )  # fmt: skip
    forgotten = _forget_clean_groups(engine, schema.groups, consumer, batch)
    return PruneResult(done.deleted, done.batches, done.seconds, forgotten)


def _forget_clean_groups(engine: Engine, groups: Table, consumer: str | None, batch: int) -> int:
    """The ``inbox_groups`` rows with nothing to check, ``batch`` per short transaction."""
    forgotten = 0
    while True:
        with locking_reads(engine) as conn, conn.begin():
            found = conn.execute(q.clean_groups(groups, consumer, batch, dialect_of(conn))).all()
            keys = [(str(r.consumer), str(r.serial_group)) for r in found]
            if keys:
                forgotten += int(conn.execute(q.forget_groups(groups, keys)).rowcount)
        if len(keys) < batch:
            return forgotten
