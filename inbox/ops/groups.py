"""``outbox inbox groups``: the serial groups that are blocked or waiting, and why.

One grouped query finds the groups with a waiting, halted or retry row; then, per group, two
``LIMIT`` lookups through ``ix_inbox_group (consumer, serial_group, state, priority, seq)``
find what holds it: a halted or processing row (exclusion) or its first row in line
(ordering). The answer is a snapshot: workers may move on while it is printed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, inspect

from inbox import queries as core_queries
from inbox.consumer import DEFAULT_DELIVERY_WINDOW
from inbox.ops import queries as q
from outbox import states
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.schema import Schema, schema_for


@dataclass(frozen=True)
class GroupReport:
    consumer: str
    group: str
    head: dict[str, Any] | None  # id, type, priority, seq, state of the row everyone waits for
    why: str
    hint: str
    waiting: int  # rows in state waiting
    retrying: int  # rows in state retry
    since: datetime  # the oldest of its waiting, halted or retry rows was received then

    def as_dict(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer, "group": self.group, "head": self.head, "why": self.why,
            "hint": self.hint, "waiting": self.waiting, "retrying": self.retrying,
            "since": self.since.isoformat(),
        }  # fmt: skip


def _at(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%dT%H:%M:%SZ}" if moment is not None else "?"


def _head(row: Any) -> dict[str, Any]:
    return {
        "id": int(row.id), "type": row.type, "priority": int(row.priority),
        "seq": int(row.seq), "state": row.state,
    }  # fmt: skip


def explain(
    consumer: str,
    group: str,
    holders: Sequence[Any],
    first: Any | None,
    outbox_ahead: int | None,
    now: datetime,
) -> tuple[Any | None, str, str]:
    """(the row everyone waits for, why, what to do) from what the lookups found."""
    halted = next((h for h in holders if h.state == states.HALTED), None)
    if halted is not None:
        return (
            halted,
            f"halted by dead message {halted.id}",
            f"`outbox inbox retry --id {halted.id} --reason ...` runs it again in its place; "
            f"`outbox inbox unblock {group} --consumer {consumer} --reason ...` lets the group go "
            "on without it",
        )
    if holders:
        running = holders[0]
        why = f"head is processing since {_at(running.claimed_at)}"
        if running.lease_until is not None and running.lease_until < now:
            return (
                running,
                f"{why}, lease expired at {_at(running.lease_until)}",
                "its worker stopped: a worker takes it back (attempts count it)",
            )
        return running, why, "its handler is running; the group goes on when it finishes"
    if first is None:
        return None, "nothing in line (the group moved on meanwhile)", ""
    if first.state == states.RETRY:
        if first.available_at > now:
            return (
                first,
                f"waiting behind retry {first.id} due at {_at(first.available_at)}",
                'on_retry="block" keeps the order; under "skip" the rest of the group '
                "goes on meanwhile",
            )
        return (
            first,
            f"retry {first.id} is due since {_at(first.available_at)}: waiting for a worker",
            "is a worker running for this consumer?",
        )
    if first.state == states.WAITING:
        if outbox_ahead is not None:
            return (
                first,
                f"waiting for outbox row {outbox_ahead}: ahead in the group, not delivered yet",
                "is the relay (or a database-source worker) running? `outbox stats`",
            )
        return (
            first,
            "waiting: head not yet promoted",
            "a worker's head-of-group pass promotes it within seconds; if it stays, is a "
            "worker running for this consumer?",
        )
    return (
        first,
        f"head {first.id} is ready: waiting for a worker",
        "is a worker running for this consumer?",
    )


def _outbox_ahead(
    conn: Connection, schema: Schema, consumer: str, group: str, first: Any, now: datetime
) -> Any:
    """Job-queue deployment: an outbox row of the group before the head that this consumer
    has not received (G5): pending, or sent within the default delivery window (a broker
    consumer waits for it; a database-source one only for pending rows)."""
    stmt = core_queries.outbox_blocker(
        schema.outbox, schema.inbox, consumer=consumer, queues=[first.queue], group=group,
        priority=int(first.priority), seq=int(first.seq),
        sent_since=now - timedelta(seconds=DEFAULT_DELIVERY_WINDOW),
    )  # fmt: skip
    return conn.execute(stmt).scalar()


def blocked_groups(
    engine: Engine,
    *,
    now: datetime,
    consumer: str | None = None,
    limit: int = 100,
    config: OutboxConfig = DEFAULT_CONFIG,
) -> list[GroupReport]:
    """The groups with a waiting, halted or retry row, longest-held first, explained."""
    schema = schema_for(config)
    t = schema.inbox
    reports = []
    with engine.connect() as conn:
        job_queue = inspect(conn).has_table(schema.outbox.name)
        for g in conn.execute(q.stuck_groups(t, consumer, limit)).all():
            name, group = str(g.consumer), str(g.serial_group)
            holders = conn.execute(q.group_holder(t, name, group)).all()
            first = conn.execute(q.group_first_in_line(t, name, group)).first()
            ahead = None
            if job_queue and not holders and first is not None and first.state == states.WAITING:
                ahead = _outbox_ahead(conn, schema, name, group, first, now)
            row, why, hint = explain(name, group, holders, first, ahead, now)
            reports.append(
                GroupReport(
                    name,
                    group,
                    _head(row) if row is not None else None,
                    why,
                    hint,
                    int(g.waiting or 0),
                    int(g.retrying or 0),
                    g.since,
                )
            )
    return reports
