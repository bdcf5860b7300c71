"""Every SQL statement of the operations package, one function per statement.

SQLAlchemy Core with bound parameters only; table objects come from ``outbox.schema_for`` so
configured table names are identifiers we validated, never user data. ``now`` is always a
parameter. Statements are portable: the one dialect difference (MySQL cannot select from the
table it deletes from) is handled in ``compact_delete``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import (
    ColumnElement,
    Connection,
    Delete,
    Insert,
    Select,
    Table,
    Text,
    Update,
    case,
    cast,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.sql.elements import TextClause

from outbox import states

INBOX_WAITING_STATES = (states.READY, states.WAITING, states.RETRY)
INBOX_FAILED_STATES = (states.FAILED, states.HALTED)
INBOX_GAUGE_STATES = (
    *INBOX_WAITING_STATES,
    states.PROCESSING,
    *INBOX_FAILED_STATES,
    *states.MANUAL_STATES,
)


def ping() -> TextClause:
    """The cheapest statement every database answers: ``outbox check``'s reachability."""
    return text("SELECT 1")


# ---- gauges (cheap: they read only unfinished or failed rows through an index on status/state)


def outbox_gauges(t: Table, now: datetime) -> Select[Any]:
    """(status, queue, priority, rows, oldest due available_at) for pending and failed rows.

    The age is measured from ``available_at`` of rows that are due: a delayed row is not late
    before its time, and a row waiting out its own backoff is a per-row problem (attempts,
    failed), not relay lag.
    """
    due = case((t.c.available_at <= now, t.c.available_at), else_=None)
    return (
        select(
            t.c.status,
            t.c.queue,
            t.c.priority,
            func.count().label("rows"),
            func.min(due).label("oldest_due"),
        )
        .where(t.c.status.in_((states.PENDING, states.FAILED)))
        .group_by(t.c.status, t.c.queue, t.c.priority)
    )


def inbox_gauges(t: Table) -> Select[Any]:
    """(consumer, state, rows, oldest received_at) for every state the gauges count: not done,
    dead, or held for an operator (review, unknown)."""
    return (
        select(
            t.c.consumer,
            t.c.state,
            func.count().label("rows"),
            func.min(t.c.received_at).label("oldest"),
        )
        .where(t.c.state.in_(INBOX_GAUGE_STATES))
        .group_by(t.c.consumer, t.c.state)
    )


def inbox_consumers(t: Table) -> Select[Any]:
    """Every consumer the inbox holds rows of (done ones included): a scan of the claim index,
    not cheap enough for every refresh, fine for a one-off ``outbox metrics --once``."""
    return select(t.c.consumer).distinct()


# ---- stats


def sent_since(t: Table, since: datetime) -> Select[Any]:
    """(queue, priority, rows) sent after ``since``."""
    return (
        select(t.c.queue, t.c.priority, func.count().label("rows"))
        .where(t.c.status == states.SENT, t.c.sent_at >= since)
        .group_by(t.c.queue, t.c.priority)
    )


def inbox_duplicates(t: Table) -> Select[Any]:
    """(consumer, duplicates absorbed) over the rows still in the table."""
    return select(t.c.consumer, func.coalesce(func.sum(t.c.duplicates), 0)).group_by(t.c.consumer)


# ---- failed / retry


def matching(
    t: Table,
    first: ColumnElement[bool],
    *,
    equal: Mapping[str, Any] | None = None,
    error_like: str | None = None,
    since_column: str = "occurred_at",
    since: datetime | None = None,
    ids: Sequence[int] | None = None,
) -> list[ColumnElement[bool]]:
    """``first`` (the status or state the command takes) and the operator's filters, each
    only when given: the ``equal`` columns, a substring of last_error, a time, the ids."""
    conditions = [first]
    conditions.extend(
        t.c[name] == value for name, value in (equal or {}).items() if value is not None
    )
    if error_like is not None:
        # A plain substring: the operator types text, not a LIKE pattern.
        conditions.append(t.c.last_error.contains(error_like, autoescape=True))
    if since is not None:
        conditions.append(t.c[since_column] >= since)
    if ids is not None:
        conditions.append(t.c.id.in_(list(ids)))
    return conditions


class RowFilters(TypedDict, total=False):
    """What operator commands narrow outbox rows by; a filter absent or None matches all."""

    queue: str | None
    type_: str | None
    error_like: str | None
    since: datetime | None


def _rows_filter(
    t: Table,
    *,
    status: str = states.FAILED,
    ids: Sequence[int] | None = None,
    **filters: Unpack[RowFilters],
) -> list[ColumnElement[bool]]:
    return matching(
        t, t.c.status == status,
        equal={"queue": filters.get("queue"), "type": filters.get("type_")},
        error_like=filters.get("error_like"), since=filters.get("since"), ids=ids,
    )  # fmt: skip


def for_update(stmt: Select[Any], conn: Connection, lock: bool) -> Select[Any]:
    """``stmt`` as SELECT ... FOR UPDATE when ``lock``; SQLite has no such clause (its write
    lock is taken at BEGIN)."""
    return stmt.with_for_update() if lock and conn.dialect.name != "sqlite" else stmt


def audit_insert(audit: Table, **values: Any) -> Insert:
    """One record of an operator's change (who, when, why, which rows)."""
    return audit.insert().values(**values)


def audit_mentioning(
    audit: Table, target: str, row_id: int, limit: int, offset: int = 0
) -> Select[Any]:
    """The newest audit records of ``target`` whose ``row_ids`` JSON contains the digits of
    ``row_id``: candidates only (id 5 matches ``[15]``), the caller keeps the exact ones.
    The JSON is read as text on every database, so no JSON operator differs by dialect."""
    return (
        select(audit)
        .where(
            audit.c.target == target,
            cast(audit.c.row_ids, Text).contains(str(int(row_id)), autoescape=True),
        )
        .order_by(audit.c.id.desc())
        .limit(limit)
        .offset(offset)
    )


def list_failed(
    t: Table, *, limit: int = 100, offset: int = 0, **filters: Unpack[RowFilters]
) -> Select[Any]:
    """The failed rows matching ``filters``, oldest id first; ``offset``: a later page."""
    return (
        select(
            t.c.id,
            t.c.queue,
            t.c.priority,
            t.c.type,
            t.c.attempts,
            t.c.serial_group,
            t.c.occurred_at,
            t.c.last_error,
        )
        .where(*_rows_filter(t, **filters))
        .order_by(t.c.id)
        .limit(limit)
        .offset(offset)
    )


def count_failed(t: Table, **filters: Unpack[RowFilters]) -> Select[Any]:
    """How many failed rows match ``filters`` (a listing's total, for its pages)."""
    return select(func.count()).select_from(t).where(*_rows_filter(t, **filters))


def show_row(t: Table, row_id: int) -> Select[Any]:
    return select(t).where(t.c.id == row_id)


def failed_ids(
    t: Table, *, ids: Sequence[int] | None = None, **filters: Unpack[RowFilters]
) -> Select[Any]:
    """The failed rows a retry would touch, in id order (for --dry-run and the audit): the
    same filters as ``list_failed``, so a retry of "every row listed" takes those rows."""
    return select(t.c.id).where(*_rows_filter(t, ids=ids, **filters)).order_by(t.c.id)


def retry_rows(t: Table, ids: Sequence[int], now: datetime) -> Update:
    """Back to pending, due now, attempts reset. Conditional on ``failed``: a row someone
    else already retried is not touched twice."""
    return (
        update(t)
        .where(t.c.id.in_(list(ids)), t.c.status == states.FAILED)
        .values(status=states.PENDING, attempts=0, available_at=now)
    )


# ---- republish


def sent_ids(
    t: Table,
    *,
    ids: Sequence[int] | None = None,
    sent_since: datetime | None = None,
    sent_until: datetime | None = None,
    **filters: Unpack[RowFilters],
) -> Select[Any]:
    """The sent rows a republish would touch, in id order (for --dry-run and the audit)."""
    conditions = _rows_filter(t, status=states.SENT, ids=ids, **filters)
    if sent_since is not None:
        conditions.append(t.c.sent_at >= sent_since)
    if sent_until is not None:
        conditions.append(t.c.sent_at < sent_until)
    return select(t.c.id).where(*conditions).order_by(t.c.id)


def republish_rows(t: Table, ids: Sequence[int], now: datetime) -> Update:
    """Back to pending, due now: the relay publishes them again. Conditional on ``sent``
    (compaction may have deleted a row meanwhile; a row is never put back twice)."""
    return (
        update(t)
        .where(t.c.id.in_(list(ids)), t.c.status == states.SENT)
        .values(status=states.PENDING, attempts=0, available_at=now, sent_at=None)
    )


# ---- compact


def compact_batch_ids(t: Table, before: datetime, batch: int) -> Select[Any]:
    """The ids of up to ``batch`` sent rows older than ``before``.

    The ids are fetched first and deleted by id: portable (no MySQL-only ``DELETE ... LIMIT``,
    and MySQL refuses a subquery on the table being deleted from), and each batch is its own
    short transaction so producers' inserts are never held up behind a long delete.
    """
    return (
        select(t.c.id)
        # No ORDER BY: sorting every old sent row to take the first 10,000 would make each
        # batch cost the whole backlog; any 10,000 of them will do.
        .where(t.c.status == states.SENT, t.c.sent_at < before)
        .limit(batch)
    )


def compact_delete(t: Table, ids: Sequence[int], before: datetime) -> Delete:
    # Re-check what made the row compactable: between the read of the ids and this delete,
    # ``outbox republish`` may have put a row back to pending and the relay sent it again
    # (a fresh ``sent_at``, and in flight for job-queue consumers): it must not go.
    return delete(t).where(t.c.id.in_(list(ids)), t.c.status == states.SENT, t.c.sent_at < before)


def count_compactable(t: Table, before: datetime) -> Select[Any]:
    return select(func.count()).where(t.c.status == states.SENT, t.c.sent_at < before)
