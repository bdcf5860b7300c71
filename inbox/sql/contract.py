"""The SQL of the message contract on the consumer side (docs/contract.md): the effect
ledger, the last applied number per (consumer, sequence key), and the rows a sequence key
holds back. Used by the runners (inside the handler's transaction) and by
``outbox inbox resolve``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Delete,
    Insert,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    delete,
    exists,
    select,
    tuple_,
    update,
)

from outbox import states
from outbox.dialect import Dialect

# -- the effect ledger ---------------------------------------------------------------------------


def record_effect(
    dialect: Dialect,
    effects: Table,
    consumer: str,
    effect_key: str,
    event_id: UUID,
    now: datetime,
) -> Insert:
    """Claim the right to the effect: one row changed = ours; none = the effect is recorded
    already (by another event id). A concurrent insert of the same key waits for the other
    transaction, then finds its row (or takes the key if that one rolled back)."""
    stmt: Insert = dialect.insert_or_ignore(effects, ["consumer", "effect_key"]).values(
        consumer=consumer, effect_key=effect_key, event_id=event_id, applied_at=now
    )
    # SQLAlchemy reports an INSERT's rowcount only when asked to.
    return stmt.execution_options(preserve_rowcount=True)


@lru_cache(maxsize=32)
def record_effects(dialect: Dialect, effects: Table) -> Insert:
    """``record_effect`` for many keys in one statement, executed with ``[{consumer,
    effect_key, event_id, applied_at}]`` (distinct keys, in key order: two batches taking
    some of the same keys wait for each other in one order). Returns the keys inserted
    now: ours; the others are recorded already. Only where INSERT has RETURNING."""
    stmt: Insert = dialect.insert_or_ignore(effects, ["consumer", "effect_key"])
    return stmt.returning(effects.c.effect_key)


@lru_cache(maxsize=32)
def forget_effect(effects: Table) -> Delete:
    """Take back a key ``record_effects`` took for a message whose handler then failed
    (its savepoint rolled back, the batch's insert did not). Parameters: consumer,
    effect_key, event_id."""
    e = effects.c
    return delete(effects).where(
        e.consumer == bindparam("consumer"),
        e.effect_key == bindparam("effect_key"),
        e.event_id == bindparam("event_id"),
    )


def effect_owner(effects: Table, consumer: str, effect_key: str) -> Select[Any]:
    """The event id whose effect holds the key, if any."""
    e = effects.c
    return select(e.event_id).where(e.consumer == consumer, e.effect_key == effect_key)


# -- sequence keys -------------------------------------------------------------------------------


def create_sequences(dialect: Dialect, sequences: Table) -> Insert:
    """Executed with ``[{consumer, sequence_key}]`` at ingest: a key's counter at 0, once."""
    stmt: Insert = dialect.insert_or_ignore(sequences, ["consumer", "sequence_key"])
    return stmt


def last_applied(sequences: Table, consumer: str, key: str, *, lock: bool = False) -> Select[Any]:
    """``lock``: hold the key's row until commit (PostgreSQL, MariaDB), so a change that
    decides to wait for its predecessor has written that it waits before the predecessor's
    apply looks for waiting successors to free."""
    s = sequences.c
    stmt = select(s.last).where(s.consumer == consumer, s.sequence_key == key)
    return stmt.with_for_update() if lock else stmt


@lru_cache(maxsize=32)
def advance(sequences: Table) -> Update:
    """Record ``number`` applied, only if it is the next one (one row changed): of two runs of
    one number, the second finds ``last`` moved and applies nothing. Built once (it runs
    before every handler of a keyed message); parameters: ``advance_parameters``."""
    s = sequences.c
    return (
        update(sequences)
        .where(
            s.consumer == bindparam("of_consumer"),
            s.sequence_key == bindparam("of_key"),
            s.last == bindparam("previous"),
        )
        .values(last=bindparam("applied"))
        .execution_options(preserve_rowcount=True)
    )


def advance_parameters(consumer: str, key: str, number: int) -> dict[str, Any]:
    return {"of_consumer": consumer, "of_key": key, "previous": number - 1, "applied": number}


def advance_past(sequences: Table, consumer: str, key: str, number: int) -> Update:
    """An operator's decision (resolve --applied / --skip): the key is at ``number`` at least."""
    s = sequences.c
    return (
        update(sequences)
        .where(s.consumer == consumer, s.sequence_key == key, s.last < number)
        .values(last=number)
    )


def free_successor(inbox: Table, consumer: str, key: str, number: int, now: datetime) -> Update:
    """The deferred change ``number + 1`` of the key may run now."""
    t = inbox.c
    return (
        update(inbox)
        .where(
            t.consumer == consumer,
            t.sequence_key == key,
            t.sequence == number + 1,
            t.state == states.DEFERRED,
        )
        .values(state=states.READY, available_at=now)
    )


@lru_cache(maxsize=32)
def free_successors(inbox: Table) -> Update:
    """``free_successor`` for every change a batch applied, in one statement: the deferred
    change ``number + 1`` of each key. Parameters: of_consumer, successors (a list of
    ``(key, number + 1)``), freed_at."""
    t = inbox.c
    return (
        update(inbox)
        .where(
            t.consumer == bindparam("of_consumer"),
            # Implied by the list, said for the planner: ix_inbox_sequence is partial on it.
            t.sequence_key.is_not(None),
            tuple_(t.sequence_key, t.sequence).in_(bindparam("successors", expanding=True)),
            t.state == states.DEFERRED,
        )
        .values(state=states.READY, available_at=bindparam("freed_at"))
        .execution_options(preserve_rowcount=True)
    )


def predecessor_kept(inbox: Table, consumer: str, key: str, number: int) -> Select[Any]:
    """Is change ``number - 1`` of the key in the inbox, not applied yet (running, due again,
    deferred itself, or held for review)? Then a gap is not a lost message: it waits."""
    t = inbox.c
    return select(
        exists().where(
            and_(
                t.consumer == consumer,
                t.sequence_key == key,
                t.sequence == number - 1,
                t.state.not_in((*FINISHED_WITHOUT_EFFECT, states.DONE)),
            )
        )
    )


# Rows of a key that can never be applied any more.
FINISHED_WITHOUT_EFFECT: tuple[str, ...] = (states.STALE, states.FAILED)


def held_numbers(inbox: Table, consumer: str, key: str) -> Select[Any]:
    """A key's rows not finished, by number (``outbox inbox review --show``)."""
    t = inbox.c
    return (
        select(t.id, t.sequence, t.state)
        .where(t.consumer == consumer, t.sequence_key == key)
        .where(t.state.not_in((states.DONE, states.STALE)))
        .order_by(t.sequence)
    )


def sequence_rows(consumer: str, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Parameters of ``create_sequences`` for the distinct keys of a received batch."""
    return [{"consumer": consumer, "sequence_key": k} for k in sorted(set(keys))]
