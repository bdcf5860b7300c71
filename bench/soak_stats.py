"""What the soak reads back from the database: progress snapshots and the final totals.

Everything is filtered by the run's queue (and the ``soak`` consumer), so a soak can run in a
database that holds other work. The verdicts come from what the database recorded, never from
what the processes said.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, and_, exists, func, select
from sqlalchemy.exc import DBAPIError

from bench.soak_consumer import NAME, effects
from outbox import states
from outbox.schema import schema_for

SCHEMA = schema_for()
OUTBOX, INBOX = SCHEMA.outbox, SCHEMA.inbox
FINISHED = (states.DONE, states.FAILED)


def _finished_row(o: Any = OUTBOX) -> Any:
    """An inbox row that finished the outbox row ``o``: done or failed."""
    return exists().where(
        and_(
            INBOX.c.event_id == o.c.event_id,
            INBOX.c.consumer == NAME,
            INBOX.c.state.in_(FINISHED),
        )
    )


@dataclass
class Snapshot:
    stored: int
    sent: int
    done: int
    failed: int
    unfinished: int  # stored, not yet done or failed
    lag: float  # age in seconds of the oldest unfinished message (0 when none)


@dataclass
class Probe:
    """Progress queries. ``floor``: every outbox row below it is finished (one producer
    thread commits in id order and a finished row stays finished), so the lag scan starts
    there instead of at the beginning of the run."""

    engine: Engine
    queue: str
    floor: int = 0
    max_lag: float = 0.0
    errors: int = 0  # snapshots the database did not answer (e.g. it was restarted)

    def try_snapshot(self) -> Snapshot | None:
        """A snapshot, or None when the database is unavailable: the soak goes on."""
        try:
            return self.snapshot()
        except DBAPIError as exc:
            self.errors += 1
            print(f"probe: database unavailable: {str(exc.orig or exc)[:120]}", flush=True)
            return None

    def snapshot(self) -> Snapshot:
        with self.engine.connect() as conn:
            by_status: dict[str, int] = dict(
                conn.execute(
                    select(OUTBOX.c.status, func.count())
                    .where(OUTBOX.c.queue == self.queue)
                    .group_by(OUTBOX.c.status)
                ).all()
            )
            by_state: dict[str, int] = dict(
                conn.execute(
                    select(INBOX.c.state, func.count())
                    .where(INBOX.c.consumer == NAME, INBOX.c.queue == self.queue)
                    .group_by(INBOX.c.state)
                ).all()
            )
            oldest = conn.execute(
                select(OUTBOX.c.id, OUTBOX.c.occurred_at)
                .where(OUTBOX.c.queue == self.queue, OUTBOX.c.id >= self.floor)
                .where(~_finished_row())
                .order_by(OUTBOX.c.id)
                .limit(1)
            ).first()
        stored = sum(by_status.values())
        done, failed = by_state.get(states.DONE, 0), by_state.get(states.FAILED, 0)
        lag = 0.0
        if oldest is not None:
            self.floor = int(oldest.id)
            lag = max(0.0, (datetime.now(UTC) - oldest.occurred_at).total_seconds())
        self.max_lag = max(self.max_lag, lag)
        return Snapshot(
            stored=stored,
            sent=by_status.get(states.SENT, 0),
            done=done,
            failed=failed,
            unfinished=stored - done - failed,
            lag=lag,
        )


@dataclass(frozen=True)
class Lost:
    """A stored message without a done/failed inbox row, and how far it got."""

    event_id: UUID
    status: str  # outbox status
    sent_at: datetime | None
    inbox_state: str  # "not received" when there is no inbox row
    order: tuple[str | None, int, int]  # (serial_group, priority, outbox id)


@dataclass
class Totals:
    stored: int = 0
    published: int = 0
    publish_failed: int = 0  # outbox rows dead-lettered by the relay
    duplicates: int = 0
    done: int = 0
    failed: int = 0
    unexpected_failed: list[UUID] = field(default_factory=list)  # failed but not poison
    lost: list[Lost] = field(default_factory=list)
    double: int = 0
    wrong_effects: int = 0  # done without an effect, or failed with one
    overlaps: int = 0
    phantoms: int = 0  # rolled-back messages that exist anyway
    end_to_end: list[float] = field(default_factory=list)  # occurred_at -> handler end, s


def totals(engine: Engine, queue: str, poison: set[UUID], rolled_back: set[UUID]) -> Totals:
    t = Totals()
    with engine.connect() as conn:
        outbox_rows = conn.execute(
            select(
                OUTBOX.c.id,
                OUTBOX.c.event_id,
                OUTBOX.c.status,
                OUTBOX.c.occurred_at,
                OUTBOX.c.sent_at,
                OUTBOX.c.serial_group,
                OUTBOX.c.priority,
            ).where(OUTBOX.c.queue == queue)
        ).all()
        inbox_rows = conn.execute(
            select(INBOX.c.event_id, INBOX.c.state, INBOX.c.duplicates).where(
                INBOX.c.consumer == NAME, INBOX.c.queue == queue
            )
        ).all()
        effect_rows = conn.execute(
            select(
                effects.c.event_id, effects.c.serial_group, effects.c.started, effects.c.ended
            ).where(effects.c.queue == queue)
        ).all()
        phantom_ids = list(rolled_back)
        for start in range(0, len(phantom_ids), 500):
            chunk = phantom_ids[start : start + 500]
            t.phantoms += conn.execute(
                select(func.count()).where(OUTBOX.c.event_id.in_(chunk))
            ).scalar_one()
            t.phantoms += conn.execute(
                select(func.count()).where(INBOX.c.event_id.in_(chunk))
            ).scalar_one()

    t.stored = len(outbox_rows)
    status = Counter(r.status for r in outbox_rows)
    t.published, t.publish_failed = status[states.SENT], status[states.FAILED]
    state = {r.event_id: r.state for r in inbox_rows}
    t.duplicates = sum(int(r.duplicates) for r in inbox_rows)
    t.done = sum(1 for s in state.values() if s == states.DONE)
    t.failed = sum(1 for s in state.values() if s == states.FAILED)
    t.unexpected_failed = [e for e, s in state.items() if s == states.FAILED and e not in poison]
    t.lost = [
        Lost(
            r.event_id,
            r.status,
            r.sent_at,
            state.get(r.event_id, "not received"),
            (r.serial_group, int(r.priority), int(r.id)),
        )
        for r in outbox_rows
        if state.get(r.event_id) not in FINISHED
    ]

    per_event = Counter(r.event_id for r in effect_rows)
    t.double = sum(1 for n in per_event.values() if n > 1)
    t.wrong_effects = sum(
        1
        for e, s in state.items()
        if (s == states.DONE and per_event[e] == 0) or (s == states.FAILED and per_event[e] > 0)
    )
    t.overlaps = count_overlaps((r.serial_group, r.started, r.ended) for r in effect_rows)
    occurred = {r.event_id: r.occurred_at.timestamp() for r in outbox_rows}
    t.end_to_end = sorted(
        r.ended - occurred[r.event_id] for r in effect_rows if r.event_id in occurred
    )
    return t


def held_behind(lost: list[Lost]) -> int:
    """Lost messages waiting in the inbox behind a message of their group that never arrived
    (G5: a sent, undelivered outbox row keeps its place in its group's order)."""
    first_gone: dict[str, tuple[int, int]] = {}
    for x in lost:
        group, priority, id_ = x.order
        if x.inbox_state == "not received" and group is not None:
            first_gone[group] = min(first_gone.get(group, (priority, id_)), (priority, id_))
    return sum(
        1
        for x in lost
        if x.inbox_state != "not received"
        and x.order[0] is not None
        and x.order[0] in first_gone
        and first_gone[x.order[0]] < x.order[1:]
    )


def count_overlaps(runs: Iterable[tuple[str | None, float, float]]) -> int:
    """Committed handler runs of one serial group whose [started, ended] intervals overlap
    (G4: must be 0). Runs that did not commit (killed, rolled back) left no row."""
    by_group: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for group, started, ended in runs:
        if group is not None:
            by_group[group].append((started, ended))
    found = 0
    for intervals in by_group.values():
        intervals.sort()
        latest_end = float("-inf")
        for started, ended in intervals:
            if started < latest_end:
                found += 1
            latest_end = max(latest_end, ended)
    return found


def quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(len(values) * q))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
