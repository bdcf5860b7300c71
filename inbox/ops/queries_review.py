"""Every SQL statement of ``outbox inbox review | resolve`` of its own, one per function (the
ledger and sequence-key statements are ``inbox.sql.contract``'s).

SQLAlchemy Core with bound parameters only; table objects come from ``outbox.schema_for``.
The listings filter on ``state`` first, so they read through ``ix_inbox_finished (state, ...)``
or ``ix_inbox_claim (consumer, state, ...)``: their cost follows the rows in those states,
never the done history.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, Table, Update, func, select, update

from outbox import states

# What an operator must decide on: the rows ``resolve`` accepts.
RESOLVABLE_STATES: tuple[str, ...] = tuple(states.MANUAL_STATES)
# What ``review --state`` may list: the manual states, and the two a sequence key produces
# on its own (finished without effect; waiting for a predecessor).
LISTABLE_STATES: tuple[str, ...] = (*RESOLVABLE_STATES, states.STALE, states.DEFERRED)


def _listed(t: Table, wanted: Sequence[str], consumer: str | None) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = [t.c.state.in_(list(wanted))]
    if consumer is not None:
        conditions.append(t.c.consumer == consumer)
    return conditions


def list_rows(t: Table, wanted: Sequence[str], consumer: str | None, limit: int) -> Select[Any]:
    """The rows in the ``wanted`` states, oldest id first."""
    c = t.c
    columns = (
        c.id, c.consumer, c.serial_group, c.type, c.state, c.reason, c.attempts, c.effect_key,
        c.sequence_key, c.sequence, c.received_at, c.finished_at, c.next_check, c.last_error,
    )  # fmt: skip
    return select(*columns).where(*_listed(t, wanted, consumer)).order_by(c.id).limit(limit)


def count_rows(t: Table, wanted: Sequence[str], consumer: str | None) -> Select[Any]:
    return select(func.count()).where(*_listed(t, wanted, consumer))


def whole_row(t: Table, row_id: int) -> Select[Any]:
    """Every column of one row (``review --show``)."""
    return select(t).where(t.c.id == row_id)


def row_to_resolve(t: Table, row_id: int) -> Select[Any]:
    """What ``resolve`` decides on and the audit keeps, whatever the row's state (a row in
    another state is named in the refusal)."""
    c = t.c
    return select(
        c.id, c.event_id, c.consumer, c.serial_group, c.state, c.reason, c.attempts,
        c.last_error, c.next_check, c.effect_key, c.sequence_key, c.sequence,
    ).where(c.id == row_id)  # fmt: skip


def _resolvable(t: Table, row_id: int) -> Update:
    # Conditional on the manual states: of two operators resolving one row, the second
    # changes nothing even where no row lock stands between them.
    return update(t).where(t.c.id == row_id, t.c.state.in_(RESOLVABLE_STATES))


def resolve_done(t: Table, row_id: int, now: datetime, reason: str | None) -> Update:
    """Finished: ``--applied`` (the reason it went to review stays) or ``--skip``
    (``reason`` is ``skipped``)."""
    values: dict[str, Any] = {
        "state": states.DONE, "finished_at": now, "claim_token": None, "lease_until": None,
    }  # fmt: skip
    if reason is not None:
        values["reason"] = reason
    return _resolvable(t, row_id).values(**values)


def resolve_ready(t: Table, row_id: int, now: datetime) -> Update:
    """``--not-applied``: runnable again, due now, attempts kept (what it used is history)."""
    return _resolvable(t, row_id).values(
        state=states.READY, available_at=now, finished_at=None, claim_token=None,
        claimed_at=None, lease_until=None, reason=None, next_check=None,
    )  # fmt: skip


def deferred_successor(t: Table, consumer: str, key: str, number: int) -> Select[Any]:
    """The deferred change ``number + 1`` of the key, if any (the one ``free_successor``
    makes ready), through ``ix_inbox_sequence``."""
    c = t.c
    return select(c.id, c.serial_group).where(
        c.consumer == consumer,
        c.sequence_key == key,
        c.sequence == number + 1,
        c.state == states.DEFERRED,
    )
