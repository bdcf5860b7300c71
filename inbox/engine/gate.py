"""What the consumer decides about a claimed message before its handler runs, and writes after
it ran: the message contract's checks (docs/contract.md, rules in ``inbox/contract.py``).

- ``refused_version``: a schema version the handler does not accept -> review, not run.
- ``before`` (inside the handler's transaction, before the handler): the sequence key's
  conditional advance ``last = n - 1 -> n`` (stale: number applied already; gap: deferred,
  then review) and the effect ledger's insert (taken: another event id applied this effect
  key -> acknowledged as a duplicate, not run). Both are row writes of the handler's
  transaction: a handler that fails rolls them back with its effect, and of two runs at once
  the second waits for the first's commit and then finds the number or the key taken.
- ``after`` (same transaction, the handler succeeded or the effect was a duplicate, once
  the transaction's own finishes are written): the key's next change, if deferred, may run
  now.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from inbox import contract
from inbox.engine.part import ConsumerPart
from inbox.sql import contract as qc
from outbox import states


@dataclass(frozen=True)
class Decided:
    """A claimed message finished without running its handler (or, for a duplicate effect
    key, acknowledged)."""

    state: str  # DEFERRED, STALE, REVIEW or DONE (a duplicate effect)
    reason: str
    available_at: datetime
    error: str | None = None
    next_check: str | None = None

    @property
    def duplicate(self) -> bool:
        return self.reason == contract.DUPLICATE_EFFECT


class Gate:
    def __init__(self, part: ConsumerPart) -> None:
        self.part = part
        self.consumer = part.consumer
        self.schema = part.schema
        # Called when a deferred change became ready (its seq is old: behind the claimer's
        # positions, ``inbox.positions``); the worker makes its claimer look back.
        self.on_ready: Callable[[], None] | None = None

    def refused_version(self, row: Any, now: datetime) -> Decided | None:
        accepted = self.consumer.versions_for(row.type)
        if contract.accepts_version(accepted, row.schema_version):
            return None
        assert accepted is not None
        given = "no schema version" if row.schema_version is None else repr(row.schema_version)
        return Decided(
            states.REVIEW,
            contract.UNSUPPORTED_SCHEMA,
            now,
            error=(
                f"{row.type!r} with {given}: the handler of consumer {self.consumer.name!r} "
                f"accepts versions {sorted(accepted)}"
            ),
            next_check=(
                "deploy a handler that accepts this version (or fix the producer), then "
                "`outbox inbox resolve ID --not-applied` to run it, or --skip to drop it"
            ),
        )

    def reserve(self, conn: Connection | Session, rows: Sequence[Any], now: datetime) -> Reserved:
        """The effect keys of a transaction's messages taken in ONE insert before any of
        them runs, rather than one insert before each handler. Only the first message of
        each key, and only keys that no message with a sequence key of the batch names
        (whose number is checked before their key may be taken); the others take theirs in
        ``before`` as they come. Where INSERT has no RETURNING (MariaDB) nothing is reserved:
        the rows inserted could not be told from the rows a past run of the same event
        left."""
        reserved = Reserved()
        if not self.part.dialect.returning:
            return reserved
        first: dict[str, Any] = {}
        # A key that a message with a sequence key of this batch also names is left to
        # ``before``: reserved for another message, that one's conditional insert would find
        # it taken and acknowledge it as a duplicate, and a failure or the time bound could
        # then give the key back with neither effect committed.
        sequenced = {r.effect_key for r in rows if r.sequence_key is not None}
        for row in rows:
            key = row.effect_key
            if key is not None and row.sequence_key is None and key not in sequenced:
                first.setdefault(key, row)
        if not first:
            return reserved
        values = [
            {
                "consumer": self.consumer.name,
                "effect_key": key,
                "event_id": first[key].event_id,
                "applied_at": now,
            }
            for key in sorted(first)
        ]
        statement = qc.record_effects(self.part.dialect, self.schema.effects)
        ours = set(conn.execute(statement, values).scalars())
        for key, row in first.items():
            (reserved.ours if key in ours else reserved.taken).add(row.id)
        return reserved

    def release(self, conn: Connection | Session, row: Any, reserved: Reserved) -> None:
        """A reserved message that will not commit its effect in this transaction (its
        handler failed in its own savepoint, or it runs in the batch's next transaction):
        its key is free again, as if ``before`` had never taken it."""
        if row.id not in reserved.ours:
            return
        reserved.ours.discard(row.id)
        key = {"consumer": self.consumer.name, "effect_key": row.effect_key}
        conn.execute(qc.forget_effect(self.schema.effects), {**key, "event_id": row.event_id})

    def before(
        self,
        conn: Connection | Session,
        row: Any,
        now: datetime,
        reserved: Reserved,
    ) -> Decided | None:
        """None: the handler may run (the number and the effect key are now this
        transaction's). Else what the row becomes instead. ``reserved``: what ``reserve``
        took for this transaction."""
        if row.sequence_key is not None and row.sequence is not None:
            decided = self._sequence(conn, row, now)
            if decided is not None:
                return decided
        if row.id in reserved.ours:
            return None
        if row.id in reserved.taken:
            return Decided(states.DONE, contract.DUPLICATE_EFFECT, now)
        if row.effect_key is not None:
            taken = conn.execute(
                qc.record_effect(
                    self.part.dialect,
                    self.schema.effects,
                    self.consumer.name,
                    row.effect_key,
                    row.event_id,
                    now,
                )
            ).rowcount  # type: ignore[attr-defined]
            if taken != 1:
                # The change counts as applied (its effect is): the caller frees the key's
                # next change as after a run.
                return Decided(states.DONE, contract.DUPLICATE_EFFECT, now)
        return None

    def after(self, conn: Connection | Session, rows: Sequence[Any], now: datetime) -> None:
        """Free the deferred successor of every change of ``rows`` (applied, or a duplicate
        effect), in one statement."""
        successors = [
            (r.sequence_key, r.sequence + 1)
            for r in rows
            if r.sequence_key is not None and r.sequence is not None
        ]
        if not successors:
            return
        parameters = {"of_consumer": self.consumer.name, "successors": successors, "freed_at": now}
        freed = conn.execute(qc.free_successors(self.schema.inbox), parameters).rowcount  # type: ignore[attr-defined]
        if freed and self.on_ready is not None:
            self.on_ready()

    def _sequence(self, conn: Connection | Session, row: Any, now: datetime) -> Decided | None:
        sequences = self.schema.inbox_sequences
        name, key, number = self.consumer.name, row.sequence_key, row.sequence
        if self._advance(conn, key, number):
            return None
        lock = self.part.dialect.row_locks
        last = conn.execute(qc.last_applied(sequences, name, key, lock=lock)).scalar()
        if last is None:  # the key's first message came in by a path that did not create it
            conn.execute(qc.create_sequences(self.part.dialect, sequences), [_key(name, key)])
            last = conn.execute(qc.last_applied(sequences, name, key, lock=lock)).scalar_one()
        verdict = contract.sequence_verdict(number, last)
        if verdict == "apply" and self._advance(conn, key, number):
            return None  # the predecessor committed between our two statements
        if verdict == "stale":
            return Decided(
                states.STALE,
                contract.STALE_NUMBER,
                now,
                error=f"change {number} of {key!r}: the last applied change is {last}",
            )
        timeout = self.consumer.sequence_gap_timeout
        gap = contract.after_gap(row.received_at, now, timeout, predecessor_kept=False)
        if gap.review:
            kept = qc.predecessor_kept(self.schema.inbox, name, key, number)
            if conn.execute(kept).scalar():
                gap = contract.after_gap(row.received_at, now, timeout, predecessor_kept=True)
        missing = f"change {number} of {key!r} waits for change {last + 1}"
        if not gap.review:
            return Decided(states.DEFERRED, contract.SEQUENCE_GAP, gap.until, error=missing)
        return Decided(
            states.REVIEW,
            contract.SEQUENCE_GAP,
            now,
            error=(f"{missing}, not received within {timeout:g}s (last applied: {last})"),
            next_check=(
                f"find change {last + 1} of {key!r} at the producer; once it is applied this "
                "one runs after `resolve ID --not-applied`; `--skip` drops this change"
            ),
        )

    def _advance(self, conn: Connection | Session, key: str, number: int) -> bool:
        changed = conn.execute(
            qc.advance(self.schema.inbox_sequences),
            qc.advance_parameters(self.consumer.name, key, number),
        ).rowcount  # type: ignore[attr-defined]
        return bool(changed == 1)


@dataclass
class Reserved:
    """What ``Gate.reserve`` did for one transaction: the rows (by id) whose effect key it
    took for them, and those whose key was recorded already (duplicates)."""

    ours: set[int] = field(default_factory=set)
    taken: set[int] = field(default_factory=set)


def _key(consumer: str, key: str) -> dict[str, Any]:
    return {"consumer": consumer, "sequence_key": key}
