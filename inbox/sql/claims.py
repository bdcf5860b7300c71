"""The SQL of the batched engine (``inbox/engine/claims.py``, ``inbox/engine/runner.py``).

Same rules as ``inbox/sql/heads.py``, whose predicates it reuses; each statement here handles a
whole batch, so a batch of N messages costs a fixed number of round trips, not N times one.
The statements a batch runs every time are built once (``lru_cache``) with named parameters:
building a SQLAlchemy statement costs more than running it. Lists go in as list parameters
(``outbox.queries.one_of``), so each statement compiles once: on PostgreSQL (``arrays``) one
array parameter, ``= ANY(:ids)``, whose text is the same for every batch size; elsewhere an
expanding ``IN``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Integer,
    Select,
    String,
    Table,
    Update,
    and_,
    bindparam,
    func,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql

from inbox.rules import SkipRetry
from inbox.sql.predicates import (
    DUE_STATES,
    FIRST_PARTS,
    candidate_columns,
    candidate_conditions,
    claimable,
    loaded_columns,
    ordering_states,
    point_ranges,
)
from outbox import states
from outbox.dialect import Dialect
from outbox.queries import one_of, per_row

# The kinds of row ``group_views`` returns.
BUSY = "busy"
HEAD = "head"
OUTBOX_HEAD = "outbox"


@lru_cache(maxsize=64)
def locked_candidates(
    table: Table,
    dialect: Dialect,
    expired: bool = True,
    shape: tuple[bool, ...] = (),
    rest: bool = False,
) -> Select[Any]:
    """``queries.candidates`` (ready rows, due retries, with ``expired`` expired claims, most
    urgent first), each branch locking what it returns with ``SKIP LOCKED``: two claimers
    read disjoint candidates instead of racing for the same ones. SQLite: ``BEGIN
    IMMEDIATE`` already made this transaction the only writer. With a ``shape``
    (``predicates.point_shape``), the ready rows are read from positions
    (``predicates.point_ranges``), not from the head of the ready range: the first parts
    with the other states, or with ``rest`` the other parts only (every branch reads up to
    ``limit`` rows and locks them, so the less urgent ones are read only when needed).
    Parameters: consumer, now, limit, and the positions' values."""
    t = table.c
    now: BindParameter[Any] = bindparam("now")
    limit = bindparam("limit", type_=Integer)
    ready, *others = candidate_conditions(table, now, expired=expired)
    parts = point_ranges(t.priority, t.seq, shape, dialect.family == "postgresql")
    chosen = parts[FIRST_PARTS:] if rest else parts[:FIRST_PARTS]
    conditions = [and_(ready, part) for part in chosen] + ([] if rest else others)
    branches = []
    for index, condition in enumerate(conditions):
        branch = (
            select(*candidate_columns(table))
            .where(t.consumer == bindparam("consumer"), condition)
            .order_by(t.priority, t.seq)
            .limit(limit)
        )
        branch = dialect.skip_locked(branch)
        branches.append(branch.subquery(f"by_state_{index}"))
    merged = union_all(*(select(branch) for branch in branches)).subquery("candidates")
    m = merged.c
    return select(merged).order_by(m.priority, m.seq, m.id).limit(limit)


@lru_cache(maxsize=64)
def lock_rows(table: Table, *, arrays: bool) -> Select[Any]:
    """Row locks on group heads (``ids``) that were not among our candidates; a row another
    claimer holds is skipped (never waited for: two claimers each waiting on the other's row
    would deadlock). SQLite never calls this."""
    t = table.c
    return select(t.id).where(one_of(t.id, "ids", arrays=arrays)).with_for_update(skip_locked=True)


@lru_cache(maxsize=64)
def group_views(
    inbox: Table, outbox: Table | None, skip_retry: SkipRetry, broker: bool, dialect: Dialect
) -> Select[Any]:
    """What the claimer needs to decide for each of ``groups``, in ONE statement (one
    snapshot, see ``queries.any_of``): its processing and halted rows (``busy``), its head
    among the rows in line (``head``), and, with ``outbox`` (job-queue deployment), its
    first committed outbox row not yet received (``outbox``).

    Every read is an index range of ``ix_inbox_group (consumer, serial_group, state, ...)``
    or ``ix_outbox_group``: unfinished rows of these groups only, never their history.
    Parameters: consumer, groups, queues, now, and with ``broker`` sent_since.
    PostgreSQL: one LATERAL ``ORDER BY ... LIMIT 1`` per group (see ``_group_views_pg``).
    """
    if dialect.family == "postgresql":
        return _group_views_pg(inbox, outbox, skip_retry, broker)
    t = inbox.c
    now: BindParameter[Any] = bindparam("now")
    columns = (t.serial_group, t.id, t.state, t.priority, t.seq, t.available_at)
    mine = and_(
        t.consumer == bindparam("consumer"), t.serial_group.in_(bindparam("groups", expanding=True))
    )
    busy = [
        select(literal(BUSY).label("kind"), *columns).where(mine, t.state == state)
        for state in (states.PROCESSING, *states.GROUP_HOLDING_STATES)
    ]
    in_line = (
        select(
            *columns,
            func.row_number()
            .over(partition_by=t.serial_group, order_by=(t.priority, t.seq, t.id))
            .label("place"),
        )
        .where(mine, ordering_states(inbox, now, skip_retry))
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
        parts.append(_outbox_heads(outbox, inbox, broker))
    return union_all(*parts)  # type: ignore[return-value]


def _group_views_pg(
    inbox: Table, outbox: Table | None, skip_retry: SkipRetry, broker: bool
) -> Select[Any]:
    """``group_views`` on PostgreSQL (``groups`` and ``queues`` are arrays): for each name of
    ``groups``, LATERAL reads of that one group: index seeks of ``ix_inbox_group`` and
    ``ix_outbox_group`` that stop at the group's first row in line. The portable form ranks
    every unfinished row of all the groups at once, and the planner, misled by the IN list,
    may read the consumer's whole unfinished set for it."""
    t = inbox.c
    now: BindParameter[Any] = bindparam("now")
    consumer: BindParameter[Any] = bindparam("consumer")

    def names() -> Any:
        array = bindparam("groups", type_=postgresql.ARRAY(String()))
        # ``AS g(name)``: without the column list ``g.name`` would mean ``name(g)``, a cast
        # to PostgreSQL's 63-byte ``name`` type (a 255-character group would not match).
        return func.unnest(array).table_valued("name").render_derived(name="g")

    def per_group(kind: str, rows: Any, g: Any, state: Any = None) -> Select[Any]:
        r = rows.c
        return select(
            literal(kind).label("kind"),
            g.c.name.label("serial_group"),
            r.id,
            r.state if state is None else state,
            r.priority,
            r.seq,
            r.available_at if state is None else null().label("available_at"),
        ).select_from(g.join(rows, true()))

    columns = (t.id, t.state, t.priority, t.seq, t.available_at)
    g_busy, g_head = names(), names()
    busy = (
        select(*columns)
        .where(
            t.consumer == consumer,
            t.serial_group == g_busy.c.name,
            t.state.in_((states.PROCESSING, *states.GROUP_HOLDING_STATES)),
        )
        .lateral("busy")
    )
    head = (
        select(*columns)
        .where(
            t.consumer == consumer,
            t.serial_group == g_head.c.name,
            ordering_states(inbox, now, skip_retry),
        )
        .order_by(t.priority, t.seq, t.id)
        .limit(1)
        .lateral("head")
    )
    parts = [per_group(BUSY, busy, g_busy), per_group(HEAD, head, g_head)]
    if outbox is not None:
        o = outbox.c
        g_outbox = names()
        first = (
            select(o.id, o.priority, o.id.label("seq"))
            .where(
                one_of(o.queue, "queues", arrays=True),
                o.serial_group == g_outbox.c.name,
                _undelivered(outbox, inbox, broker),
            )
            .order_by(o.priority, o.id)
            .limit(1)
            .lateral("first_undelivered")
        )
        parts.append(
            per_group(OUTBOX_HEAD, first, g_outbox, literal(states.PENDING).label("state"))
        )
    return union_all(*parts)  # type: ignore[return-value]


def _undelivered(outbox: Table, inbox: Table, broker: bool) -> ColumnElement[bool]:
    """``queries.outbox_blocker``'s rule: pending rows; with a broker also rows sent since
    ``sent_since`` and not received."""
    o = outbox.c
    undelivered: ColumnElement[bool] = o.status == states.PENDING
    if broker:
        received = (
            select(inbox.c.id)
            .where(inbox.c.event_id == o.event_id, inbox.c.consumer == bindparam("consumer"))
            .exists()
        )
        undelivered = or_(
            undelivered,
            and_(o.status == states.SENT, o.sent_at >= bindparam("sent_since"), ~received),
        )
    return undelivered


def _outbox_heads(outbox: Table, inbox: Table, broker: bool) -> Select[Any]:
    """Per group, the first (priority, id) undelivered outbox row (``queries.outbox_blocker``'s
    rule: pending rows; with a broker also rows sent since ``sent_since`` and not received)."""
    o = outbox.c
    undelivered = _undelivered(outbox, inbox, broker)
    ranked = (
        select(
            o.serial_group,
            o.id,
            o.priority,
            func.row_number()
            .over(partition_by=o.serial_group, order_by=(o.priority, o.id))
            .label("place"),
        )
        .where(
            o.queue.in_(bindparam("queues", expanding=True)),
            o.serial_group.in_(bindparam("groups", expanding=True)),
            undelivered,
        )
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


@lru_cache(maxsize=64)
def claim_many(table: Table, returning: bool, *, arrays: bool) -> Update:
    """``queries.claim`` for a whole batch: each row only while still in the state its check
    was made for (``fresh``: ready, waiting or a due retry; ``resumed``: an expired claim).
    One token for the pass; every later change names (id, token), so a claim stays one
    row's own (a claim taken back gets a new token). Parameters: ids (fresh and resumed),
    fresh, resumed, token, now, lease_until."""
    t = table.c
    now: BindParameter[Any] = bindparam("now")
    # The outer id list keeps it a primary-key lookup (InnoDB would otherwise scan and lock
    # its way through the table for the OR); ``claimable`` checks the state per row, so that
    # PostgreSQL does not read ix_inbox_claim's entries of every ready row for it.
    condition = and_(
        one_of(t.id, "ids", arrays=arrays),
        or_(
            and_(one_of(t.id, "fresh", arrays=arrays), claimable(table, now)),
            and_(one_of(t.id, "resumed", arrays=arrays), claimable(table, now, resumed=True)),
        ),
    )
    stmt = (
        update(table)
        .where(condition)
        .values(
            state=states.PROCESSING,
            claim_token=bindparam("token"),
            claimed_at=now,
            lease_until=bindparam("lease_until"),
            attempts=t.attempts + 1,
        )
    )
    return stmt.returning(*loaded_columns(table)) if returning else stmt


@lru_cache(maxsize=64)
def load_claimed(table: Table, *, arrays: bool) -> Select[Any]:
    """MariaDB/MySQL (no UPDATE ... RETURNING): which of ``ids`` this pass claimed
    (``token``)."""
    return select(*loaded_columns(table)).where(_held(table, arrays))


@lru_cache(maxsize=64)
def mark_waiting_many(table: Table, *, arrays: bool) -> Update:
    """Parameters: ids, now."""
    t = table.c
    now: BindParameter[Any] = bindparam("now")
    state = per_row(t.state)
    return (
        update(table)
        .where(
            one_of(t.id, "ids", arrays=arrays),
            or_(state == states.READY, and_(state.in_(DUE_STATES), t.available_at <= now)),
        )
        .values(state=states.WAITING)
    )


def _held(table: Table, arrays: bool) -> ColumnElement[bool]:
    """The token fence of ``queries._fenced`` for the rows ``ids`` of one claim pass
    (``token``)."""
    t = table.c
    return and_(
        one_of(t.id, "ids", arrays=arrays),
        t.claim_token == bindparam("token"),
        per_row(t.state) == states.PROCESSING,
    )


@lru_cache(maxsize=64)
def finish_done_many(table: Table, *, arrays: bool) -> Update:
    """Parameters: ids, token, now."""
    return (
        update(table)
        .where(_held(table, arrays))
        .values(state=states.DONE, finished_at=bindparam("now"), lease_until=None, last_error=None)
    )


@lru_cache(maxsize=64)
def still_held(table: Table, *, arrays: bool) -> Select[Any]:
    """Parameters: ids, token."""
    return select(table.c.id).where(_held(table, arrays))


@lru_cache(maxsize=64)
def renew_leases(table: Table, *, arrays: bool) -> Update:
    """Every claim a worker holds (``ids``, ``tokens``), in one statement (a row taken back
    by another worker has a token not among ours). Parameters: ids, tokens, lease_until."""
    t = table.c
    return (
        update(table)
        .where(
            one_of(t.id, "ids", arrays=arrays),
            one_of(t.claim_token, "tokens", arrays=arrays),
            per_row(t.state) == states.PROCESSING,
        )
        .values(lease_until=bindparam("lease_until"))
    )


@lru_cache(maxsize=64)
def next_retry_due(table: Table) -> Select[Any]:
    """When the consumer's next retry falls due (None: no retry waiting). Parameter:
    consumer."""
    t = table.c
    return select(func.min(t.available_at)).where(
        t.consumer == bindparam("consumer"), t.state.in_(DUE_STATES)
    )
