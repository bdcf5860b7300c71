"""Every SQL statement of ``outbox inbox failed | retry | prune | groups``, one per function.

SQLAlchemy Core with bound parameters only: consumer, group, type and error text are always
parameters, table objects come from ``outbox.schema_for``. ``now`` is always passed in.
Each statement filters on ``state`` first so it reads through an index that has it
(``ix_inbox_claim (consumer, state, ...)``, ``ix_inbox_group (consumer, serial_group, state,
priority, seq)``, ``ix_inbox_finished (state, finished_at)``), never through the done history.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import (
    ColumnElement,
    Delete,
    Select,
    Table,
    Update,
    case,
    delete,
    false,
    func,
    select,
    tuple_,
)
from sqlalchemy import update as sql_update

from inbox.sql.heads import notify as notify
from inbox.sql.heads import unblock as _unblock
from outbox import states
from outbox.dialect import Dialect
from outbox.ops.queries import matching

# Dead rows: ``failed`` and ``halted`` (dead under on_dead="halt", holding its group).
DEAD_STATES = (states.FAILED, states.HALTED)
IN_LINE_STATES = (states.READY, states.WAITING, states.RETRY)
# A group is listed by ``groups`` when one of its rows is in one of these states: ``ready``
# too, since a ready row nobody claims (no worker running) holds its group as surely.
STUCK_STATES = (states.READY, states.WAITING, states.RETRY, *states.GROUP_HOLDING_STATES)


# ---- failed --------------------------------------------------------------------------------


class DeadFilters(TypedDict, total=False):
    """What operator commands narrow dead rows by; a filter absent or None matches all."""

    consumer: str | None
    type_: str | None
    group: str | None
    error_like: str | None
    since: datetime | None  # when it died


def _dead_filter(
    t: Table, *, ids: Sequence[int] | None = None, **filters: Unpack[DeadFilters]
) -> list[ColumnElement[bool]]:
    equal = {
        "consumer": filters.get("consumer"), "type": filters.get("type_"),
        "serial_group": filters.get("group"),
    }  # fmt: skip
    return matching(
        t, t.c.state.in_(DEAD_STATES), equal=equal, error_like=filters.get("error_like"),
        since_column="finished_at", since=filters.get("since"), ids=ids,
    )  # fmt: skip


def list_dead(
    t: Table, *, limit: int, offset: int = 0, **filters: Unpack[DeadFilters]
) -> Select[Any]:
    """Dead rows matching ``filters``, oldest id first; ``offset``: a later page."""
    c = t.c
    return (
        select(
            c.id,
            c.consumer,
            c.serial_group,
            c.queue,
            c.priority,
            c.type,
            c.state,
            c.attempts,
            c.event_id,
            c.received_at,
            c.finished_at,
            c.last_error,
        )
        .where(*_dead_filter(t, **filters))
        .order_by(c.id)
        .limit(limit)
        .offset(offset)
    )


def count_dead(t: Table, **filters: Unpack[DeadFilters]) -> Select[Any]:
    """How many dead rows match ``filters`` (a listing's total, for its pages)."""
    return select(func.count()).select_from(t).where(*_dead_filter(t, **filters))


def show_row(t: Table, row_id: int) -> Select[Any]:
    c = t.c
    return select(
        c.id, c.event_id, c.consumer, c.serial_group, c.queue, c.priority, c.seq, c.type,
        c.state, c.attempts, c.duplicates, c.payload, c.headers, c.last_error, c.occurred_at,
        c.received_at, c.available_at, c.claimed_at, c.lease_until, c.finished_at,
    ).where(c.id == row_id)  # fmt: skip


# ---- retry ---------------------------------------------------------------------------------


def dead_rows(
    t: Table, *, ids: Sequence[int] | None, **filters: Unpack[DeadFilters]
) -> Select[Any]:
    """The dead rows a retry would touch, in id order, with what the audit keeps of them:
    the filters of ``list_dead``, so a retry of "every row listed" takes those rows."""
    c = t.c
    return (
        select(c.id, c.consumer, c.serial_group, c.state, c.attempts, c.last_error)
        .where(*_dead_filter(t, ids=ids, **filters))
        .order_by(c.id)
    )


def halted_rows(t: Table, consumer: str | None) -> Select[Any]:
    """Every halted row (one per halted group at most: a halted row holds its group)."""
    c = t.c
    stmt = select(c.id, c.consumer, c.serial_group).where(c.state == states.HALTED)
    return stmt.where(c.consumer == consumer) if consumer is not None else stmt


def halted_in_group(t: Table, consumer: str, group: str) -> Select[Any]:
    """The row that halts (consumer, group), with what the audit keeps of it (none: not halted)."""
    c = t.c
    return (
        select(c.id, c.consumer, c.serial_group, c.state, c.attempts, c.last_error)
        .where(c.consumer == consumer, c.serial_group == group, c.state == states.HALTED)
        .order_by(c.id)
    )


def retry_rows(t: Table, ids: Sequence[int], state: str, now: datetime) -> Update:
    """Back in line as ``ready``: attempts reset, due now, no claim, not finished.

    Conditional on the state the rows were read in: a row someone else changed meanwhile
    (another operator's retry, an ``unblock``) is left as that change made it. ``last_error``
    stays until the next run replaces it; the audit record keeps it for good.
    """
    c = t.c
    return (
        sql_update(t)
        .where(c.id.in_(list(ids)), c.state == state)
        .values(
            state=states.READY,
            attempts=0,
            available_at=now,
            claim_token=None,
            claimed_at=None,
            lease_until=None,
            finished_at=None,
        )
    )


def unblock_row(t: Table, consumer: str, group: str, row_id: int) -> Update:
    """The code API's statement (``inbox.unblock``), narrowed to the row read and audited."""
    return _unblock(t, consumer, group).where(t.c.id == row_id)


# ---- prune ---------------------------------------------------------------------------------


def _prunable(t: Table, before: datetime, consumer: str | None) -> list[ColumnElement[bool]]:
    conditions = [t.c.state == states.DONE, t.c.finished_at < before]
    if consumer is not None:
        conditions.append(t.c.consumer == consumer)
    return conditions


def count_prunable(t: Table, before: datetime, consumer: str | None) -> Select[Any]:
    return select(func.count()).where(*_prunable(t, before, consumer))


def prune_batch_ids(t: Table, before: datetime, consumer: str | None, batch: int) -> Select[Any]:
    """Up to ``batch`` ids of done rows finished before ``before``.

    Ids first, then ``DELETE ... WHERE id IN``: portable (no MySQL-only ``DELETE ... LIMIT``;
    MySQL refuses a subquery on the table it deletes from). No ORDER BY: sorting the whole
    backlog to take its first rows would make every batch cost all of it.
    """
    return select(t.c.id).where(*_prunable(t, before, consumer)).limit(batch)


def clean_groups(groups: Table, consumer: str | None, batch: int, dialect: Dialect) -> Select[Any]:
    """Up to ``batch`` ``inbox_groups`` rows with nothing for the head pass, locked ``SKIP
    LOCKED`` (a row a marker or the head pass holds is left for the next prune)."""
    c = groups.c
    stmt = select(c.consumer, c.serial_group).where(c.needs_check == false())
    if consumer is not None:
        stmt = stmt.where(c.consumer == consumer)
    stmt = stmt.limit(batch)
    return dialect.skip_locked(stmt)


def forget_groups(groups: Table, keys: Sequence[tuple[str, str]]) -> Delete:
    """Delete those rows, still unmarked: a row marked since it was read stays (a marker
    that comes after the delete writes its row again, marked)."""
    c = groups.c
    return delete(groups).where(
        tuple_(c.consumer, c.serial_group).in_(list(keys)), c.needs_check == false()
    )


def prune_delete(t: Table, ids: Sequence[int], before: datetime) -> Delete:
    # Re-check state and age: a delete that trusts a list read earlier must never take a
    # failed, halted or unfinished row with it.
    return delete(t).where(
        t.c.id.in_(list(ids)), t.c.state == states.DONE, t.c.finished_at < before
    )


# ---- groups --------------------------------------------------------------------------------


def _count_state(t: Table, state: str) -> Any:
    return func.sum(case((t.c.state == state, 1), else_=0))


def stuck_groups(t: Table, consumer: str | None, limit: int) -> Select[Any]:
    """Groups with a ready, waiting, halted or retry row, longest-held first, with their
    counts.

    Reads only rows in those states (``ix_inbox_claim`` with a consumer, ``ix_inbox_finished``
    without): its cost follows the unfinished rows, not the history.
    """
    c = t.c
    stmt = select(
        c.consumer,
        c.serial_group,
        _count_state(t, states.READY).label("ready"),
        _count_state(t, states.WAITING).label("waiting"),
        _count_state(t, states.HALTED).label("halted"),
        _count_state(t, states.RETRY).label("retrying"),
        func.min(c.received_at).label("since"),
    ).where(c.state.in_(STUCK_STATES), c.serial_group.is_not(None))
    if consumer is not None:
        stmt = stmt.where(c.consumer == consumer)
    return (
        stmt.group_by(c.consumer, c.serial_group)
        .order_by(func.min(c.received_at), c.consumer, c.serial_group)
        .limit(limit)
    )


def _row_columns(t: Table) -> tuple[Any, ...]:
    c = t.c
    return (
        c.id, c.type, c.priority, c.seq, c.state, c.queue, c.claimed_at, c.lease_until,
        c.available_at, c.finished_at,
    )  # fmt: skip


def group_holder(t: Table, consumer: str, group: str) -> Select[Any]:
    """The group's holding (halted, review, unknown) or processing row(s): what excludes
    everyone else."""
    c = t.c
    return (
        select(*_row_columns(t))
        .where(
            c.consumer == consumer,
            c.serial_group == group,
            c.state.in_((*states.GROUP_HOLDING_STATES, states.PROCESSING)),
        )
        .order_by(c.id)
        .limit(2)
    )


def group_first_in_line(t: Table, consumer: str, group: str) -> Select[Any]:
    """The smallest (priority, seq, id) among the group's ready, waiting and retry rows (the
    head under on_retry="block", the default)."""
    c = t.c
    return (
        select(*_row_columns(t))
        .where(c.consumer == consumer, c.serial_group == group, c.state.in_(IN_LINE_STATES))
        .order_by(c.priority, c.seq, c.id)
        .limit(1)
    )


def undelivered_groups(o: Table, limit: int) -> Select[Any]:
    """Job-queue deployment: groups with pending outbox rows (nobody has received them yet),
    longest-held first, with their counts.

    Reads pending rows only (``ix_outbox_relay (status, ...)``): its cost follows the
    backlog, not the sent history.
    """
    c = o.c
    return (
        select(
            c.queue,
            c.serial_group,
            func.count().label("pending"),
            func.min(c.occurred_at).label("since"),
        )
        .where(c.status == states.PENDING, c.serial_group.is_not(None))
        .group_by(c.queue, c.serial_group)
        .order_by(func.min(c.occurred_at), c.queue, c.serial_group)
        .limit(limit)
    )


def groups_in_the_inbox(t: Table) -> Select[Any]:
    """Every group with an unfinished or halted inbox row, of any consumer: the groups
    someone has received, so not "still only in the outbox". Reads those rows only
    (``ix_inbox_finished (state, ...)``)."""
    c = t.c
    unfinished = (*states.INBOX_UNFINISHED_STATES, states.HALTED)
    return (
        select(c.serial_group)
        .where(c.state.in_(unfinished), c.serial_group.is_not(None))
        .distinct()
    )


def undelivered_head(o: Table, queue: str, group: str) -> Select[Any]:
    """The group's first pending outbox row in (priority, id), through ``ix_outbox_group
    (queue, serial_group, status, priority, id)``."""
    c = o.c
    return (
        select(c.id, c.type, c.priority, c.available_at)
        .where(c.queue == queue, c.serial_group == group, c.status == states.PENDING)
        .order_by(c.priority, c.id)
        .limit(1)
    )
