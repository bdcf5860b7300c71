"""The SQL of the head-of-group pass and of the blocker checks it makes under the group lock,
one function per statement (``inbox.engine.heads``); the operator commands reuse some.

SQLAlchemy Core with bound parameters only; names (queue, group, consumer, type) are always
parameters. ``now`` is always passed in: queries never read the database clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    exists,
    func,
    or_,
    select,
    union_all,
    update,
)

from inbox.rules import SkipRetry
from inbox.sql.predicates import (
    ahead_of,
    candidate_columns,
    candidate_conditions,
    ordering_states,
)
from outbox import states
from outbox.dialect import POSTGRESQL
from outbox.queries import one_of


def notify(channel: str, payload: str) -> Select[Any]:
    """PostgreSQL only; delivered at commit (the operator commands wake the workers)."""
    return POSTGRESQL.notify(channel, payload)


# --- claim ----------------------------------------------------------------------------------


# States a row leaves at its ``available_at``: a retry's backoff, a deferred change's
# check of its sequence gap.


def candidates(table: Table, consumer: str, now: datetime, limit: int) -> Select[Any]:
    """Rows to try to claim, most urgent first: ready rows, due retries, expired claims.

    One ``ORDER BY ... LIMIT`` branch per state so each reads ``ix_inbox_claim (consumer,
    state, priority, seq)`` in order and stops after ``limit`` rows (a single OR over the
    states sorts every match), merged by (priority, seq) in one statement: one round trip.
    WAITING rows are not candidates: they come back as READY through the head-of-group pass
    when they become their group's head.
    """
    t = table.c
    branches = [
        select(*candidate_columns(table))
        .where(t.consumer == consumer, condition)
        .order_by(t.priority, t.seq)
        .limit(limit)
        .subquery(f"by_state_{index}")
        for index, condition in enumerate(candidate_conditions(table, now))
    ]
    merged = union_all(*(select(branch) for branch in branches)).subquery("candidates")
    m = merged.c
    return select(merged).order_by(m.priority, m.seq, m.id).limit(limit)


def inbox_blocker(
    table: Table,
    *,
    consumer: str,
    group: str,
    row_id: int,
    priority: int,
    seq: int,
    now: datetime,
    skip_retry: SkipRetry,
    ordering: bool = True,
) -> Select[Any]:
    """One blocker of a row, if any: a processing (or halted) row of the same (consumer,
    group) -- exclusion -- OR an unfinished one ordered before it -- ordering. Two separate
    conditions: with the ordering one alone, a running lower-priority row would not hold
    back a newer urgent one (the PROCESSING clause of G5)."""
    t = table.c
    exclusion = t.state.in_((states.PROCESSING, *states.GROUP_HOLDING_STATES))
    condition: ColumnElement[bool] = exclusion
    if ordering:
        condition = or_(
            exclusion,
            and_(ordering_states(table, now, skip_retry), ahead_of(table, priority, seq, row_id)),
        )
    return (
        select(t.id, t.state)
        .where(t.consumer == consumer, t.serial_group == group, t.id != row_id, condition)
        .limit(1)
    )


def outbox_blocker(
    outbox: Table,
    inbox: Table,
    *,
    consumer: str,
    queues: Sequence[str],
    group: str,
    priority: int,
    seq: int,
    sent_since: datetime | None,
) -> Select[Any]:
    """Job-queue deployment: a committed outbox row of the group, ordered before (priority,
    seq), that this consumer has not received yet. Pending rows always count; with a broker,
    rows sent since ``sent_since`` without an inbox row count too (in flight). Rows sent
    earlier are taken as delivered, which keeps the lookup off the table's history."""
    o = outbox.c
    ahead = or_(o.priority < priority, and_(o.priority == priority, o.id < seq))
    undelivered: ColumnElement[bool] = o.status == states.PENDING
    if sent_since is not None:
        received = exists().where(inbox.c.event_id == o.event_id, inbox.c.consumer == consumer)
        undelivered = or_(
            undelivered, and_(o.status == states.SENT, o.sent_at >= sent_since, ~received)
        )
    return (
        select(o.id)
        .where(o.queue.in_(list(queues)), o.serial_group == group, ahead, undelivered)
        .limit(1)
    )


def any_of(checks: Sequence[Select[Any]]) -> Select[Any]:
    """``SELECT EXISTS (...) OR EXISTS (...)``: several blocker checks as ONE statement.

    Not a convenience: on READ COMMITTED each statement reads its own snapshot. A predecessor
    moves from "undelivered outbox row" to "inbox row" in one commit by another worker; checked
    in two statements, that commit can land between them and hide it from both (G5).
    """
    return select(or_(*(check.exists() for check in checks)))


# --- head of group --------------------------------------------------------------------------


def group_head(
    table: Table, consumer: str, group: str, now: datetime, skip_retry: SkipRetry
) -> Select[Any]:
    """The smallest (priority, seq) among the group's rows in line."""
    t = table.c
    return (
        select(t.id, t.state, t.priority, t.seq)
        .where(
            t.consumer == consumer,
            t.serial_group == group,
            ordering_states(table, now, skip_retry),
        )
        .order_by(t.priority, t.seq, t.id)
        .limit(1)
    )


def promote(table: Table, row_id: int) -> Update:
    t = table.c
    return update(table).where(t.id == row_id, t.state == states.WAITING).values(state=states.READY)


def waiting_heads(
    table: Table,
    consumer: str,
    now: datetime,
    skip_retry: SkipRetry,
    groups: Sequence[str] | None = None,
) -> Select[Any]:
    """Groups whose head is WAITING and nothing of the group is processing or halted; with
    ``groups``, among those groups only. See ``_waiting_heads``."""
    t = table.c
    among = t.serial_group.is_not(None) if groups is None else t.serial_group.in_(list(groups))
    return _waiting_heads(table, consumer, now, skip_retry, among)


@lru_cache(maxsize=64)
def waiting_heads_among(table: Table, skip_retry: SkipRetry, *, arrays: bool) -> Select[Any]:
    """``waiting_heads`` among ``groups`` (the marked pass), built once: parameters consumer,
    now, groups (a list; one array with ``arrays``, see ``outbox.queries.one_of``)."""
    among = one_of(table.c.serial_group, "groups", arrays=arrays)
    return _waiting_heads(table, bindparam("consumer"), bindparam("now"), skip_retry, among)


def _waiting_heads(
    table: Table,
    consumer: Any,
    now: Any,
    skip_retry: SkipRetry,
    among: ColumnElement[bool],
) -> Select[Any]:
    """Groups whose head is WAITING and nothing of the group is processing or halted.

    One pass over the consumer's rows in line (``ix_inbox_claim (consumer, state, ...)``: the
    unfinished rows only, never the history), numbered per group in (priority, seq, id)
    order; the first of each group is its head. Then, for the waiting heads only, two
    equality probes of ``ix_inbox_group (consumer, serial_group, state)`` for a processing or
    halted row. Joining the table back on (group, priority) and (group, priority, seq)
    instead would walk every row of the group, done ones included, on MariaDB (a ``ref`` on
    the index prefix cannot use the state list).
    """
    t = table.c
    retry_in_line: ColumnElement[bool] = t.state == states.RETRY
    if skip_retry is True:
        retry_in_line = and_(retry_in_line, t.available_at <= now)
    elif skip_retry:
        retry_in_line = and_(
            retry_in_line, or_(t.available_at <= now, t.queue.not_in(list(skip_retry)))
        )
    # One branch per state, each an equality on (consumer, state): MariaDB reads an IN list
    # on the index's second column as a ref on consumer alone, i.e. the whole history.
    in_line = union_all(
        *(
            select(t.id, t.serial_group, t.state, t.priority, t.seq).where(
                t.consumer == consumer, among, condition
            )
            for condition in (t.state == states.READY, t.state == states.WAITING, retry_in_line)
        )
    ).subquery("in_line")
    i = in_line.c
    ranked = select(
        i.id,
        i.serial_group,
        i.state,
        i.priority,
        i.seq,
        func.row_number()
        .over(partition_by=i.serial_group, order_by=(i.priority, i.seq, i.id))
        .label("place"),
    ).subquery("ranked")
    r = ranked.c
    blocker = table.alias("blocker")

    def running(state: str) -> Any:
        return exists().where(
            blocker.c.consumer == consumer,
            blocker.c.serial_group == r.serial_group,
            blocker.c.state == state,
        )

    return (
        select(r.id, r.serial_group)
        .where(
            r.place == 1,
            r.state == states.WAITING,
            ~running(states.PROCESSING),
            *(~running(state) for state in states.GROUP_HOLDING_STATES),
        )
        .order_by(r.priority, r.seq, r.id)
    )


# --- idle check and operations --------------------------------------------------------------


def state_counts(table: Table, consumer: str) -> Select[Any]:
    t = table.c
    return (
        select(t.state, func.count())
        .where(t.consumer == consumer, t.state.in_(states.INBOX_UNFINISHED_STATES))
        .group_by(t.state)
    )


def unblock(table: Table, consumer: str, group: str) -> Update:
    t = table.c
    return (
        update(table)
        .where(t.consumer == consumer, t.serial_group == group, t.state == states.HALTED)
        .values(state=states.FAILED)
    )
