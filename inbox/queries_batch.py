"""The SQL of the batched engine (``inbox/batch_claims.py``, ``inbox/batch_runner.py``).

Same rules as ``inbox/queries.py``, whose predicates it reuses; each statement here handles a
whole batch, so a batch of N messages costs a fixed number of round trips, not N times one.
Lists go in as expanding ``IN`` parameters, so every statement compiles once per shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    Update,
    and_,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)

from inbox.queries import _loaded, _ordering_states, claimable
from inbox.rules import StepAside
from outbox import states

# The kinds of row ``group_views`` returns.
BUSY = "busy"
HEAD = "head"
OUTBOX_HEAD = "outbox"


def locked_candidates(
    table: Table, consumer: str, now: datetime, limit: int, family: str
) -> Select[Any]:
    """``queries.candidates`` (ready rows, due retries, expired claims, most urgent first),
    each branch locking what it returns with ``SKIP LOCKED``: two claimers read disjoint
    candidates instead of racing for the same ones. SQLite: ``BEGIN IMMEDIATE`` already made
    this transaction the only writer."""
    t = table.c
    columns = (t.id, t.serial_group, t.priority, t.seq, t.state)
    conditions = (
        t.state == states.READY,
        and_(t.state == states.RETRY, t.available_at <= now),
        and_(t.state == states.PROCESSING, t.lease_until < now),
    )
    branches = []
    for index, condition in enumerate(conditions):
        branch = (
            select(*columns)
            .where(t.consumer == consumer, condition)
            .order_by(t.priority, t.seq)
            .limit(limit)
        )
        if family != "sqlite":
            branch = branch.with_for_update(skip_locked=True)
        branches.append(branch.subquery(f"by_state_{index}"))
    merged = union_all(*(select(branch) for branch in branches)).subquery("candidates")
    m = merged.c
    return select(merged).order_by(m.priority, m.seq, m.id).limit(limit)


def lock_rows(table: Table, ids: Sequence[int]) -> Select[Any]:
    """Row locks on group heads that were not among our candidates; a row another claimer
    holds is skipped (never waited for: two claimers each waiting on the other's row would
    deadlock). SQLite never calls this."""
    t = table.c
    return select(t.id).where(t.id.in_(list(ids))).with_for_update(skip_locked=True)


def try_locks_pg(keys: Sequence[int]) -> Select[Any]:
    """One row: ``pg_try_advisory_xact_lock`` per group key, in order; held until commit."""
    return select(*(func.pg_try_advisory_xact_lock(key) for key in keys))


def get_locks_mysql(names: Sequence[str]) -> Select[Any]:
    """One row: ``GET_LOCK(name, 0)`` per group (1 obtained, 0 busy, NULL error)."""
    return select(*(func.get_lock(name, 0) for name in names))


def release_locks_mysql(names: Sequence[str]) -> Select[Any]:
    return select(*(func.release_lock(name) for name in names))


def group_views(
    inbox: Table,
    outbox: Table | None,
    *,
    consumer: str,
    groups: Sequence[str],
    queues: Sequence[str],
    now: datetime,
    skip_retry: StepAside,
    sent_since: datetime | None,
) -> Select[Any]:
    """What the claimer needs to decide for each of ``groups``, in ONE statement (one
    snapshot, see ``queries.any_of``): its processing and halted rows (``busy``), its head
    among the rows in line (``head``), and, with ``outbox`` (job-queue deployment), its
    first committed outbox row not yet received (``outbox``).

    Every read is an index range of ``ix_inbox_group (consumer, serial_group, state, ...)``
    or ``ix_outbox_group``: unfinished rows of these groups only, never their history.
    """
    t = inbox.c
    names = list(groups)
    columns = (t.serial_group, t.id, t.state, t.priority, t.seq, t.available_at)
    mine = and_(t.consumer == consumer, t.serial_group.in_(names))
    busy = [
        select(literal(BUSY).label("kind"), *columns).where(mine, t.state == state)
        for state in (states.PROCESSING, states.HALTED)
    ]
    in_line = (
        select(
            *columns,
            func.row_number()
            .over(partition_by=t.serial_group, order_by=(t.priority, t.seq, t.id))
            .label("place"),
        )
        .where(mine, _ordering_states(inbox, now, skip_retry))
        .subquery("in_line")
    )
    i = in_line.c
    parts: list[Select[Any]] = [
        *busy,
        select(
            literal(HEAD).label("kind"),
            i.serial_group,
            i.id,
            i.state,
            i.priority,
            i.seq,
            i.available_at,
        ).where(i.place == 1),
    ]
    if outbox is not None:
        parts.append(_outbox_heads(outbox, inbox, consumer, names, queues, sent_since))
    return union_all(*parts)  # type: ignore[return-value]


def _outbox_heads(
    outbox: Table,
    inbox: Table,
    consumer: str,
    groups: list[str],
    queues: Sequence[str],
    sent_since: datetime | None,
) -> Select[Any]:
    """Per group, the first (priority, id) undelivered outbox row (``queries.outbox_blocker``'s
    rule: pending rows; with a broker also rows sent since ``sent_since`` and not received)."""
    o = outbox.c
    undelivered: ColumnElement[bool] = o.status == states.PENDING
    if sent_since is not None:
        received = (
            select(inbox.c.id)
            .where(inbox.c.event_id == o.event_id, inbox.c.consumer == consumer)
            .exists()
        )
        undelivered = or_(
            undelivered, and_(o.status == states.SENT, o.sent_at >= sent_since, ~received)
        )
    ranked = (
        select(
            o.serial_group,
            o.id,
            o.priority,
            func.row_number()
            .over(partition_by=o.serial_group, order_by=(o.priority, o.id))
            .label("place"),
        )
        .where(o.queue.in_(list(queues)), o.serial_group.in_(groups), undelivered)
        .subquery("undelivered")
    )
    r = ranked.c
    return select(
        literal(OUTBOX_HEAD).label("kind"),
        r.serial_group,
        r.id,
        literal(states.PENDING).label("state"),
        r.priority,
        r.id.label("seq"),
        null().label("available_at"),
    ).where(r.place == 1)


def claim_many(
    table: Table,
    fresh: Sequence[int],
    resumed: Sequence[int],
    token: Any,
    now: datetime,
    lease_until: datetime,
    *,
    returning: bool,
) -> Update:
    """``queries.claim`` for a whole batch: each row only while still in the state its check
    was made for (``fresh``: ready, waiting or a due retry; ``resumed``: an expired claim).
    One token for the pass; every later change names (id, token), so a claim stays one
    row's own (a claim taken back gets a new token)."""
    t = table.c
    # The outer id list keeps it a primary-key lookup (InnoDB would otherwise scan and lock
    # its way through the table for the OR).
    condition = and_(
        t.id.in_([*fresh, *resumed]),
        or_(
            and_(t.id.in_(list(fresh)), claimable(table, now)),
            and_(t.id.in_(list(resumed)), claimable(table, now, resumed=True)),
        ),
    )
    stmt = (
        update(table)
        .where(condition)
        .values(
            state=states.PROCESSING,
            claim_token=token,
            claimed_at=now,
            lease_until=lease_until,
            attempts=t.attempts + 1,
        )
    )
    return stmt.returning(*_loaded(table)) if returning else stmt


def load_claimed(table: Table, ids: Sequence[int], token: Any) -> Select[Any]:
    """MariaDB/MySQL (no UPDATE ... RETURNING): which of ``ids`` this pass claimed."""
    return select(*_loaded(table)).where(_held(table, ids, token))


def mark_waiting_many(table: Table, ids: Sequence[int], now: datetime) -> Update:
    t = table.c
    return (
        update(table)
        .where(
            t.id.in_(list(ids)),
            or_(t.state == states.READY, and_(t.state == states.RETRY, t.available_at <= now)),
        )
        .values(state=states.WAITING)
    )


def _held(table: Table, ids: Sequence[int], token: Any) -> ColumnElement[bool]:
    """The token fence of ``queries._fenced`` for several rows of one claim pass."""
    t = table.c
    return and_(t.id.in_(list(ids)), t.claim_token == token, t.state == states.PROCESSING)


def finish_done_many(table: Table, ids: Sequence[int], token: Any, now: datetime) -> Update:
    return (
        update(table)
        .where(_held(table, ids, token))
        .values(state=states.DONE, finished_at=now, lease_until=None, last_error=None)
    )


def still_held(table: Table, ids: Sequence[int], token: Any) -> Select[Any]:
    return select(table.c.id).where(_held(table, ids, token))


def renew_leases(
    table: Table, ids: Sequence[int], tokens: Sequence[Any], lease_until: datetime
) -> Update:
    """Every claim a worker holds, in one statement (a row taken back by another worker
    has a token not among ours)."""
    t = table.c
    return (
        update(table)
        .where(t.id.in_(list(ids)), t.claim_token.in_(list(tokens)), t.state == states.PROCESSING)
        .values(lease_until=lease_until)
    )


def next_retry_due(table: Table, consumer: str) -> Select[Any]:
    """When the consumer's next retry falls due (None: no retry waiting)."""
    t = table.c
    return select(func.min(t.available_at)).where(t.consumer == consumer, t.state == states.RETRY)
