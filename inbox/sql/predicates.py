"""The predicates and columns that the claim pass (``inbox.sql.claims``) and the head-of-group
pass (``inbox.sql.heads``) share: which states a claim may take, what is a candidate, what is
in line before a row, and what a runner reads of a claimed row.

Bound parameters only; ``now`` is always passed in (a value, or a bound parameter of a
statement built once): queries never read the database clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Integer, Table, and_, bindparam, or_, true, tuple_

from inbox.rules import SkipRetry
from outbox import states
from outbox.queries import per_row

# Finished for now, due again at ``available_at``: a retry, or a change waiting for its
# predecessor (a sequence gap).
DUE_STATES = (states.RETRY, states.DEFERRED)

# A point in time: a value, or a bound parameter of a statement built once.
Moment = datetime | ColumnElement[Any]


def claimable(table: Table, now: Moment, *, resumed: bool = False) -> ColumnElement[bool]:
    """States a claim may take. A fresh claim: ready, waiting or a due retry. ``resumed``: a
    processing row whose lease expired (its worker died: G9), and nothing else.

    The two are separate on purpose: the claimer decides whether the ordering check applies
    from the state it read; if the row changed state since (an expired claim that its slow
    worker finished as a retry), the conditional claim must fail rather than start the row
    without the check it needed.
    """
    # Checked on the rows of an id list only (``per_row``): see ``claims.claim_many``.
    t = table.c
    state = per_row(t.state)
    if resumed:
        return and_(state == states.PROCESSING, t.lease_until < now)
    return or_(
        state.in_((states.READY, states.WAITING)),
        and_(state.in_(DUE_STATES), t.available_at <= now),
    )


def candidate_columns(table: Table) -> tuple[ColumnElement[Any], ...]:
    """What a claimer reads of each candidate."""
    t = table.c
    return (t.id, t.serial_group, t.priority, t.seq, t.state)


def candidate_conditions(
    table: Table, now: Any, *, expired: bool = True
) -> tuple[ColumnElement[bool], ...]:
    """One condition per claimable state, each read by its own ordered branch: ready rows,
    due retries and deferred changes, and with ``expired`` expired claims. ``now`` is a value
    or a bind parameter."""
    t = table.c
    conditions = (
        t.state == states.READY,
        and_(t.state == states.RETRY, t.available_at <= now),
        and_(t.state == states.DEFERRED, t.available_at <= now),
    )
    if not expired:
        return conditions
    return (*conditions, and_(t.state == states.PROCESSING, t.lease_until < now))


# ``point_ranges``' parts read first: the most urgent known priority from its position, and
# the priorities before it. The rest (``[FIRST_PARTS:]``) only when those do not fill the read.
FIRST_PARTS = 2


def point_ranges(
    priority: ColumnElement[Any],
    seq: ColumnElement[Any],
    shape: tuple[bool, ...],
    row_values: bool = True,
) -> tuple[ColumnElement[bool], ...]:
    """A range ordered by (priority, seq) split at positions (``inbox.positions``), one
    index range per part, each read by its own ordered branch: the most urgent known
    priority after its position and the priorities before it (``FIRST_PARTS``), then the
    other known priorities after theirs, and the priorities between and after the known
    ones from their first row (``point_shape``: which of the between-ranges can hold a
    priority at all). No positions: the whole range. ``row_values``: a position as a row
    comparison, for PostgreSQL's planner (see ``from_position``).
    Parameters: p0, after0, p1, ..."""
    if not shape:
        return (true(),)
    k = len(shape)
    p = [bindparam(f"p{i}", type_=Integer) for i in range(k)]
    after = [bindparam(f"after{i}", type_=BigInteger) for i in range(k)]

    def from_position(i: int) -> ColumnElement[bool]:
        # A row comparison, not ``priority = p AND seq > after``: that form lets the planner
        # read the primary key from ``after`` (seq is the outbox id) and filter on priority,
        # through every row of the other priorities; this one starts the read of the
        # (..., priority, seq) index at the position, and ends it with the priority.
        if not row_values:
            return and_(priority == p[i], seq > after[i])
        return and_(tuple_(priority, seq) > tuple_(p[i], after[i]), priority <= p[i])

    parts: list[ColumnElement[bool]] = [from_position(0), priority < p[0]]
    parts += [from_position(i) for i in range(1, k)]
    for i, gap in enumerate(shape):
        if gap:
            parts.append(
                priority > p[i] if i == k - 1 else and_(priority > p[i], priority < p[i + 1])
            )
    return tuple(parts)


def settled(rows: Sequence[Any], limit: int, points: Sequence[tuple[int, int]]) -> bool:
    """Whether the first parts' read is the whole answer: ``limit`` rows, none less urgent
    than the first known priority (every row of the other parts is)."""
    if not points:
        return True
    first = points[0][0]
    return len(rows) >= limit and all(r.priority <= first for r in rows)


def point_shape(points: Sequence[tuple[int, int]]) -> tuple[bool, ...]:
    """Per position, whether a priority can lie between it and the next (always after the
    last): the statement of ``point_ranges`` reads only those ranges."""
    priorities = [priority for priority, _ in points]
    return tuple(
        i == len(priorities) - 1 or priorities[i + 1] - priorities[i] > 1
        for i in range(len(priorities))
    )


def point_values(points: Sequence[tuple[int, int]]) -> dict[str, int]:
    """The parameters of ``point_ranges`` for these (priority, after) pairs."""
    values: dict[str, int] = {}
    for i, (priority, after) in enumerate(points):
        values[f"p{i}"] = priority
        values[f"after{i}"] = after
    return values


def ahead_of(table: Table, priority: int, seq: int, row_id: int) -> ColumnElement[bool]:
    """Rows ordered before (priority, seq, id): the G5 order, id only breaking ties."""
    t = table.c
    return or_(
        t.priority < priority,
        and_(t.priority == priority, t.seq < seq),
        and_(t.priority == priority, t.seq == seq, t.id < row_id),
    )


def ordering_states(table: Table, now: Moment, skip_retry: SkipRetry) -> ColumnElement[bool]:
    """Unfinished rows that keep their place in the group order. With on_retry="skip" a
    retry row waiting out its backoff steps aside; once due it is back in line.
    ``skip_retry``: True for every queue, False for none, or a tuple of queues (a queue's
    own policy, ``Consumer(queue_policies=...)``)."""
    t = table.c
    if skip_retry is True:
        return or_(
            t.state.in_((states.READY, states.WAITING)),
            and_(t.state == states.RETRY, t.available_at <= now),
        )
    if skip_retry:
        return or_(
            t.state.in_((states.READY, states.WAITING)),
            and_(
                t.state == states.RETRY,
                or_(t.available_at <= now, t.queue.not_in(list(skip_retry))),
            ),
        )
    return t.state.in_((states.READY, states.WAITING, states.RETRY))


def loaded_columns(table: Table) -> tuple[Any, ...]:
    """What a runner needs of a claimed row."""
    t = table.c
    return (
        t.id,
        t.event_id,
        t.type,
        t.payload,
        t.priority,
        t.serial_group,
        t.queue,
        t.headers,
        t.attempts,
        t.seq,
        t.occurred_at,
        t.claim_token,
        t.effect_key,
        t.sequence_key,
        t.sequence,
        t.schema_version,
        t.received_at,
    )
