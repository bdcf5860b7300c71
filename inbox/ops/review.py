"""What ``outbox inbox review | resolve`` do, without click: the rows the automatic path left
to an operator (``review``, ``unknown``), and the operator's decision on one of them.

A decision is one transaction that locks the row, changes it only if it is still in
``review`` or ``unknown`` (conditional UPDATE), does what the decision means for the effect
ledger, the row's sequence key and its serial group, and writes the audit record. SQL comes
from ``inbox.ops.queries_review`` and ``inbox.sql.contract``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, Engine, Row, Table, Update

from inbox import contract
from inbox.consumer import Consumer
from inbox.engine.marks import mark_groups
from inbox.ingest import wake_payload
from inbox.ops import queries as q
from inbox.ops import queries_review as qr
from inbox.sql import contract as qc
from outbox import states
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.dialect import dialect_of
from outbox.errors import OutboxError, ValidationError
from outbox.ops import core
from outbox.ops.core import jsonable, locking_reads
from outbox.ops.queries import audit_insert, for_update
from outbox.schema import Schema, schema_for

APPLIED: Final = "applied"
NOT_APPLIED: Final = "not-applied"
SKIP: Final = "skip"
MODES: Final = (APPLIED, NOT_APPLIED, SKIP)
ACTIONS: Final = {mode: f"resolve-{mode}" for mode in MODES}
DEFAULT_STATES: Final = qr.RESOLVABLE_STATES
LISTABLE_STATES: Final = qr.LISTABLE_STATES


class NotResolvable(OutboxError):
    """The row does not exist, or is not (any more) in ``review`` or ``unknown``."""

    def __init__(self, row_id: int, state: str | None) -> None:
        self.row_id = row_id
        self.state = state
        if state is None:
            message = f"id: no inbox row with id {row_id}"
        else:
            message = (
                f"id: inbox row {row_id} is {state}, not review or unknown: only a row held "
                "for an operator can be resolved (`outbox inbox review` lists them)"
            )
        super().__init__(message)


# ---- review --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewList:
    rows: list[dict[str, Any]]
    total: int  # rows in those states (of the consumer): more than ``rows`` when cut at limit
    limit: int

    @property
    def more(self) -> int:
        return max(self.total - len(self.rows), 0)


def check_states(wanted: Sequence[str]) -> tuple[str, ...]:
    unknown = sorted(set(wanted) - set(LISTABLE_STATES))
    if unknown:
        raise ValidationError("state", f"not one of {', '.join(LISTABLE_STATES)}: {unknown}")
    return tuple(dict.fromkeys(wanted)) or DEFAULT_STATES


def list_review(
    engine: Engine,
    *,
    config: OutboxConfig = DEFAULT_CONFIG,
    wanted: Sequence[str] = DEFAULT_STATES,
    consumer: str | None = None,
    limit: int = 50,
) -> ReviewList:
    """The rows in the ``wanted`` states, oldest id first, and how many there are in all."""
    chosen = check_states(wanted)
    t = schema_for(config).inbox
    with engine.connect() as conn:
        rows = [
            {k: jsonable(v) for k, v in r._mapping.items()}
            for r in conn.execute(qr.list_rows(t, chosen, consumer, limit))
        ]
        total = int(conn.execute(qr.count_rows(t, chosen, consumer)).scalar_one())
    return ReviewList(rows, max(total, len(rows)), limit)


# The fields an operator decides by, first; the rest of the row after them.
_SHOWN_FIRST = (
    "id", "consumer", "state", "reason", "attempts", "next_check", "last_error", "effect_key",
    "effect_owner", "sequence_key", "sequence", "last_applied", "held", "serial_group",
)  # fmt: skip


def show(
    engine: Engine, row_id: int, *, config: OutboxConfig = DEFAULT_CONFIG
) -> dict[str, Any] | None:
    """One inbox row whole, with what its keys hold: the event whose effect holds its effect
    key (``effect_owner``), its sequence key's last applied number and the key's other
    unfinished rows (``held``: id, sequence, state)."""
    schema = schema_for(config)
    with engine.connect() as conn:
        row = conn.execute(qr.whole_row(schema.inbox, row_id)).first()
        if row is None:
            return None
        found = {k: jsonable(v) for k, v in row._mapping.items()}
        consumer, key = str(row.consumer), row.sequence_key
        found["effect_owner"] = None
        if row.effect_key is not None:
            owner = conn.execute(qc.effect_owner(schema.effects, consumer, row.effect_key))
            found["effect_owner"] = jsonable(owner.scalar())
        found["last_applied"] = None
        found["held"] = []
        if key is not None:
            found["last_applied"] = conn.execute(
                qc.last_applied(schema.inbox_sequences, consumer, key)
            ).scalar()
            found["held"] = [
                {"id": int(h.id), "sequence": h.sequence, "state": h.state}
                for h in conn.execute(qc.held_numbers(schema.inbox, consumer, key))
                if int(h.id) != row_id
            ]
    first = {k: found[k] for k in _SHOWN_FIRST}
    return first | {k: v for k, v in found.items() if k not in first}


# ---- resolve -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolveResult:
    id: int
    consumer: str
    mode: str
    action: str
    old_state: str
    new_state: str
    serial_group: str | None
    sequence_key: str | None
    sequence: int | None
    last_before: int | None  # the key's last applied number before (None: no key)
    last_after: int | None
    freed: int | None  # the deferred successor made ready (dry run: that would be)
    effect_key: str | None
    # --applied with an effect key: True recorded now (dry run: would be); False the ledger
    # holds the key already, for ``effect_owner``.
    effect_recorded: bool | None
    effect_owner: str | None
    audit_id: int | None  # None on a dry run
    dry_run: bool
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Plan:
    last_before: int | None = None
    last_after: int | None = None
    freed: Row[Any] | None = None
    effect_recorded: bool | None = None
    effect_owner: str | None = None
    notes: list[str] = field(default_factory=list)


def resolve(
    engine: Engine,
    row_id: int,
    *,
    mode: str,
    now: datetime,
    reason: str,
    actor: str,
    config: OutboxConfig = DEFAULT_CONFIG,
    dry_run: bool = False,
) -> ResolveResult:
    """An operator's decision on a row in ``review`` or ``unknown``:

    - ``applied``: its effect happened. The row is done; its effect key goes in the ledger;
      its sequence key moves to its number at least and the key's deferred next change is
      made ready; its group goes on.
    - ``not-applied``: it did not. The row is ready again, due now (attempts kept).
    - ``skip``: it must never be applied. The row is done (reason ``skipped``), nothing in
      the ledger; the key and the group go on as for ``applied``.

    Raises :class:`NotResolvable` (nothing written) for a missing row or one in another state,
    also when another operator resolved it first.
    """
    core.check_reason(reason)
    if mode not in MODES:
        raise ValidationError("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    schema = schema_for(config)
    t = schema.inbox
    with locking_reads(engine) as conn, conn.begin():
        row = conn.execute(for_update(qr.row_to_resolve(t, row_id), conn, not dry_run)).first()
        if row is None or row.state not in qr.RESOLVABLE_STATES:
            raise NotResolvable(row_id, None if row is None else str(row.state))
        plan = _Plan()
        audit_id = None
        if dry_run:
            _foresee(conn, schema, row, mode, plan)
        else:
            changed = conn.execute(_row_update(t, row_id, mode, now)).rowcount
            if changed != 1:  # resolved by someone else between our read and our write
                state = conn.execute(qr.row_to_resolve(t, row_id)).first()
                raise NotResolvable(row_id, None if state is None else str(state.state))
            _apply(conn, schema, row, mode, now, plan)
            audit_id = _audit(conn, schema, row, mode, now, actor, reason)
            _wake(conn, config, str(row.consumer), mode == NOT_APPLIED or plan.freed is not None)
    return _result(row, mode, plan, audit_id, dry_run)


def _row_update(t: Table, row_id: int, mode: str, now: datetime) -> Update:
    if mode == NOT_APPLIED:
        return qr.resolve_ready(t, row_id, now)
    return qr.resolve_done(t, row_id, now, contract.SKIPPED if mode == SKIP else None)


def _moves_key(mode: str, row: Row[Any]) -> bool:
    return mode != NOT_APPLIED and row.sequence_key is not None and row.sequence is not None


def _last(conn: Connection, schema: Schema, row: Row[Any], lock: bool) -> int | None:
    stmt = qc.last_applied(schema.inbox_sequences, str(row.consumer), str(row.sequence_key))
    value = conn.execute(for_update(stmt, conn, lock)).scalar()
    return None if value is None else int(value)


def _successor(
    conn: Connection, schema: Schema, row: Row[Any], number: int, lock: bool
) -> Row[Any] | None:
    stmt = qr.deferred_successor(schema.inbox, str(row.consumer), str(row.sequence_key), number)
    return conn.execute(for_update(stmt, conn, lock)).first()


def _owner(conn: Connection, schema: Schema, row: Row[Any]) -> str | None:
    stmt = qc.effect_owner(schema.effects, str(row.consumer), str(row.effect_key))
    owner = conn.execute(stmt).scalar()
    return None if owner is None else str(owner)


def _foresee(conn: Connection, schema: Schema, row: Row[Any], mode: str, plan: _Plan) -> None:
    """A dry run: what ``_apply`` would do, read without locks or writes."""
    if row.sequence_key is not None:
        plan.last_before = plan.last_after = _last(conn, schema, row, lock=False)
    if _moves_key(mode, row):
        plan.last_after = max(plan.last_before or 0, int(row.sequence))
        plan.freed = _successor(conn, schema, row, plan.last_after, lock=False)
    if row.effect_key is not None:
        plan.effect_owner = _owner(conn, schema, row)
        if mode == APPLIED:
            plan.effect_recorded = plan.effect_owner is None
    _note_effect(row, mode, plan)


def _apply(
    conn: Connection, schema: Schema, row: Row[Any], mode: str, now: datetime, plan: _Plan
) -> None:
    consumer = str(row.consumer)
    dialect = dialect_of(conn)
    if row.effect_key is not None:
        held_before = _owner(conn, schema, row)
        if mode == APPLIED:
            # Whose the key is after the insert says whether this decision recorded it.
            stmt = qc.record_effect(
                dialect, schema.effects, consumer, str(row.effect_key), row.event_id, now
            )
            conn.execute(stmt)
        plan.effect_owner = _owner(conn, schema, row)
        if mode == APPLIED:
            plan.effect_recorded = held_before is None and plan.effect_owner == str(row.event_id)
    if row.sequence_key is not None:
        key = str(row.sequence_key)
        if _moves_key(mode, row):
            # The key's counter exists from the first message of the key on; a row inserted
            # some other way still gets one, so the decision is never lost.
            conn.execute(
                qc.create_sequences(dialect, schema.inbox_sequences),
                qc.sequence_rows(consumer, [key]),
            )
        plan.last_before = plan.last_after = _last(conn, schema, row, lock=True)
        if _moves_key(mode, row):
            conn.execute(qc.advance_past(schema.inbox_sequences, consumer, key, int(row.sequence)))
            plan.last_after = _last(conn, schema, row, lock=True)
            assert plan.last_after is not None
            plan.freed = _successor(conn, schema, row, plan.last_after, lock=True)
            if plan.freed is not None:
                conn.execute(qc.free_successor(schema.inbox, consumer, key, plan.last_after, now))
    groups = [row.serial_group, None if plan.freed is None else plan.freed.serial_group]
    mark_groups(conn, schema.groups, consumer, groups)
    _note_effect(row, mode, plan)


def _note_effect(row: Row[Any], mode: str, plan: _Plan) -> None:
    owner = plan.effect_owner
    if row.effect_key is None or owner is None:
        return
    key = row.effect_key
    mine = owner == str(row.event_id)
    if mode == APPLIED and not plan.effect_recorded:
        who = "this row's own event" if mine else f"event {owner}, not this row's"
        plan.notes.append(f"effect key {key!r} was already in the ledger, held by {who}")
    elif mode == NOT_APPLIED:
        plan.notes.append(
            f"effect key {key!r} is in the ledger (event {owner}): the next run of this row "
            "finds it and is acknowledged without running its handler"
        )


def _audit(
    conn: Connection,
    schema: Schema,
    row: Row[Any],
    mode: str,
    now: datetime,
    actor: str,
    reason: str,
) -> int:
    result = conn.execute(
        audit_insert(
            schema.audit, at=now, actor=actor, action=ACTIONS[mode], target="inbox",
            reason=reason, row_count=1, row_ids=json.dumps([int(row.id)]),
        )
    )  # fmt: skip
    assert result.inserted_primary_key is not None
    return int(result.inserted_primary_key[0])


def _wake(conn: Connection, config: OutboxConfig, consumer: str, runnable: bool) -> None:
    """PostgreSQL: a row made ready wakes the consumer's workers at commit."""
    if runnable and dialect_of(conn).notifies:
        stub = Consumer(consumer, queues=["resolve"], config=config)
        conn.execute(q.notify(config.notify_channel, wake_payload(stub)))


def _result(
    row: Row[Any], mode: str, plan: _Plan, audit_id: int | None, dry_run: bool
) -> ResolveResult:
    new_state = states.READY if mode == NOT_APPLIED else states.DONE
    return ResolveResult(
        id=int(row.id), consumer=str(row.consumer), mode=mode, action=ACTIONS[mode],
        old_state=str(row.state), new_state=new_state, serial_group=row.serial_group,
        sequence_key=row.sequence_key,
        sequence=None if row.sequence is None else int(row.sequence),
        last_before=plan.last_before, last_after=plan.last_after,
        freed=None if plan.freed is None else int(plan.freed.id),
        effect_key=row.effect_key, effect_recorded=plan.effect_recorded,
        effect_owner=plan.effect_owner, audit_id=audit_id, dry_run=dry_run, notes=plan.notes,
    )  # fmt: skip
