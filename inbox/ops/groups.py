"""``outbox inbox groups``: the serial groups that are blocked or waiting, and why.

One grouped query finds the groups with a ready, waiting, halted or retry row; then, per
group, two ``LIMIT`` lookups through ``ix_inbox_group (consumer, serial_group, state,
priority, seq)`` find what holds it: a halted or processing row (exclusion) or its first row
in line (ordering). When the database also holds the outbox (job-queue deployment), a second
grouped query finds the groups whose rows are still only there (pending: no consumer has
received them), reported once for every consumer of their queue. The answer is a snapshot:
workers may move on while it is printed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, inspect

from inbox.consumer import DEFAULT_DELIVERY_WINDOW
from inbox.ops import queries as q
from inbox.sql import heads as core_queries
from outbox import states
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.schema import Schema, schema_for


@dataclass(frozen=True)
class GroupReport:
    # None: a group nobody has received yet, so every consumer of its queue waits for it.
    consumer: str | None
    group: str
    head: dict[str, Any] | None  # id, type, priority, seq, state of the row everyone waits for
    why: str
    hint: str
    waiting: int  # rows in state waiting
    retrying: int  # rows in state retry
    since: datetime  # its oldest listed row was received (an outbox row: stored) then
    ready: int = 0  # rows in state ready
    pending: int = 0  # outbox rows of a group nobody has received yet

    @property
    def in_line(self) -> int:
        """Rows that wait for the head or for a worker (what the text's WAITING shows)."""
        return self.ready + self.waiting + self.pending

    def as_dict(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer, "group": self.group, "head": self.head, "why": self.why,
            "hint": self.hint, "waiting": self.waiting, "ready": self.ready,
            "retrying": self.retrying, "pending": self.pending, "since": self.since.isoformat(),
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
    held = next((h for h in holders if h.state in states.MANUAL_STATES), None)
    if held is not None:
        return (
            held,
            f"held by message {held.id} in {held.state} (the message contract)",
            f"`outbox inbox review --show {held.id}` says why and what to check; "
            f"`outbox inbox resolve {held.id} --applied | --not-applied | --skip --reason ...`",
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
    if outbox_ahead is not None:  # a waiting or ready head
        return (
            first,
            f"waiting for outbox row {outbox_ahead}: ahead in the group, not delivered yet",
            "is the relay (or a database-source worker) running? `outbox stats`",
        )
    if first.state == states.WAITING:
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


# A head in these states may be held by an undelivered outbox row ahead of it; a retry head
# has run, so what was ahead of it had been received by then.
_AHEADABLE = (states.WAITING, states.READY)


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


def _head_of_outbox_row(row: Any) -> dict[str, Any]:
    # The inbox's seq is the outbox id, so both kinds of head read alike.
    return {
        "id": int(row.id), "type": row.type, "priority": int(row.priority),
        "seq": int(row.id), "state": states.PENDING,
    }  # fmt: skip


def _undelivered(conn: Connection, schema: Schema, now: datetime, limit: int) -> list[GroupReport]:
    """Job-queue deployment: groups with pending outbox rows that no consumer has an
    unfinished inbox row of (one that has is listed from the inbox, and there the pending
    row is named as what its head waits for)."""
    o = schema.outbox
    found = conn.execute(q.undelivered_groups(o, limit)).all()
    if not found:
        return []
    received = set(conn.execute(q.groups_in_the_inbox(schema.inbox)).scalars())
    reports = []
    for g in found:
        queue, group = str(g.queue), str(g.serial_group)
        if group in received:
            continue
        head = conn.execute(q.undelivered_head(o, queue, group)).first()
        if head is None:  # published meanwhile
            continue
        if head.available_at > now:
            why = f"waiting for outbox row {head.id}: not due until {_at(head.available_at)}"
            hint = (
                "stored with a delay, or backing off after a broker refusal; every consumer "
                f"of queue {queue!r} waits for it"
            )
        else:
            why = f"waiting for outbox row {head.id}: not delivered to any consumer yet"
            hint = (
                f"is the relay (or a database-source worker) running for queue {queue!r}? "
                "`outbox stats`"
            )
        reports.append(
            GroupReport(
                consumer=None,
                group=group,
                head=_head_of_outbox_row(head),
                why=why,
                hint=hint,
                waiting=0,
                retrying=0,
                since=g.since,
                pending=int(g.pending),
            )
        )
    return reports


def blocked_groups(
    engine: Engine,
    *,
    now: datetime,
    consumer: str | None = None,
    limit: int = 100,
    config: OutboxConfig = DEFAULT_CONFIG,
) -> list[GroupReport]:
    """The groups with a ready, waiting, halted or retry row, and (job-queue deployment)
    those still only in the outbox, longest-held first, explained."""
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
            if job_queue and not holders and first is not None and first.state in _AHEADABLE:
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
                    ready=int(g.ready or 0),
                )
            )
        if job_queue:
            reports += _undelivered(conn, schema, now, limit)
    reports.sort(key=lambda r: r.since)  # stable: each query's own order is kept on ties
    return reports[:limit]
