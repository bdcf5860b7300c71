"""Rows written straight into the tables, with the times and states a test needs."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Table, select

from outbox import states
from outbox.schema import schema_for

SCHEMA = schema_for()


def outbox_row(
    conn: Connection,
    *,
    queue: str = "mail",
    priority: int = 1,
    status: str = states.PENDING,
    occurred_at: datetime,
    available_at: datetime | None = None,
    sent_at: datetime | None = None,
    type_: str = "send",
    attempts: int = 0,
    last_error: str | None = None,
    payload: Any = None,
) -> int:
    result = conn.execute(
        SCHEMA.outbox.insert().values(
            event_id=uuid.uuid4(),
            queue=queue,
            priority=priority,
            type=type_,
            payload=json.dumps(payload if payload is not None else {"n": 1}),
            headers=json.dumps({"trace": "t-1"}),
            occurred_at=occurred_at,
            available_at=available_at or occurred_at,
            status=status,
            attempts=attempts,
            last_error=last_error,
            sent_at=sent_at,
        )
    )
    assert result.inserted_primary_key is not None
    return int(result.inserted_primary_key[0])


def inbox_row(
    conn: Connection,
    *,
    consumer: str,
    state: str,
    received_at: datetime,
    seq: int,
    serial_group: str | None = None,
    duplicates: int = 0,
    table: Table = SCHEMA.inbox,
) -> None:
    conn.execute(
        table.insert().values(
            event_id=uuid.uuid4(),
            consumer=consumer,
            queue="jobs",
            priority=1,
            serial_group=serial_group,
            seq=seq,
            type="job",
            payload=json.dumps({}),
            headers=json.dumps({}),
            state=state,
            duplicates=duplicates,
            available_at=received_at,
            received_at=received_at,
            finished_at=received_at + timedelta(seconds=1)
            if state in (states.DONE, states.FAILED)
            else None,
        )
    )


def statuses(conn: Connection) -> dict[int, tuple[str, int]]:
    t = SCHEMA.outbox
    return {
        int(i): (s, int(a)) for i, s, a in conn.execute(select(t.c.id, t.c.status, t.c.attempts))
    }
