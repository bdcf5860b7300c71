"""Inbox (and outbox) rows written straight into the tables, in the states a test needs."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select

from outbox import states
from outbox.schema import schema_for

SCHEMA = schema_for()
NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=40)


def inbox_row(
    conn: Connection,
    *,
    state: str,
    consumer: str = "c1",
    group: str | None = None,
    priority: int = 1,
    seq: int = 1,
    type_: str = "job",
    attempts: int = 0,
    last_error: str | None = None,
    received_at: datetime = OLD,
    finished_at: datetime | None = None,
    available_at: datetime | None = None,
    claimed_at: datetime | None = None,
    lease_until: datetime | None = None,
    payload: Any = None,
) -> int:
    """One row; ``finished_at`` defaults to a second after receipt for finished states."""
    finished = states.DONE, states.FAILED, states.HALTED
    if finished_at is None and state in finished:
        finished_at = received_at + timedelta(seconds=1)
    result = conn.execute(
        SCHEMA.inbox.insert().values(
            event_id=uuid.uuid4(),
            consumer=consumer,
            queue="jobs",
            priority=priority,
            serial_group=group,
            seq=seq,
            type=type_,
            payload=json.dumps(payload if payload is not None else {"n": seq}),
            headers=json.dumps({"trace": "t-1"}),
            state=state,
            attempts=attempts,
            last_error=last_error,
            available_at=available_at or received_at,
            received_at=received_at,
            finished_at=finished_at,
            claim_token=uuid.uuid4() if state == states.PROCESSING else None,
            claimed_at=claimed_at,
            lease_until=lease_until,
        )
    )
    assert result.inserted_primary_key is not None
    return int(result.inserted_primary_key[0])


def pending_outbox_row(conn: Connection, *, group: str, priority: int = 1) -> int:
    """A committed, undelivered outbox row of ``group`` in queue ``jobs``."""
    result = conn.execute(
        SCHEMA.outbox.insert().values(
            event_id=uuid.uuid4(),
            queue="jobs",
            priority=priority,
            serial_group=group,
            key=group,
            type="job",
            payload="{}",
            headers="{}",
            occurred_at=OLD,
            available_at=OLD,
            status=states.PENDING,
        )
    )
    assert result.inserted_primary_key is not None
    return int(result.inserted_primary_key[0])


def inbox_states(conn: Connection) -> dict[int, tuple[str, int]]:
    """id -> (state, attempts) of every inbox row."""
    t = SCHEMA.inbox
    return {
        int(i): (str(s), int(a))
        for i, s, a in conn.execute(select(t.c.id, t.c.state, t.c.attempts))
    }
