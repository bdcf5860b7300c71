"""Inbox rows of the message contract written straight into the tables: held for review or
unknown, stale, deferred, with their keys, and what the keys hold (last applied, ledger)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, select

from outbox import states
from outbox.schema import schema_for

SCHEMA = schema_for()
RECEIVED = datetime.now(UTC) - timedelta(hours=1)


def contract_row(
    conn: Connection,
    *,
    state: str,
    consumer: str = "c1",
    group: str | None = None,
    seq: int = 1,
    type_: str = "invoice.reminder",
    attempts: int = 0,
    reason: str | None = None,
    next_check: str | None = None,
    last_error: str | None = None,
    effect_key: str | None = None,
    sequence_key: str | None = None,
    sequence: int | None = None,
    event_id: uuid.UUID | None = None,
) -> int:
    finished = states.DONE, states.STALE
    result = conn.execute(
        SCHEMA.inbox.insert().values(
            event_id=event_id or uuid.uuid4(), consumer=consumer, queue="jobs", priority=1,
            serial_group=group, seq=seq, type=type_, payload=json.dumps({"n": seq}),
            headers=json.dumps({"trace": "t-1"}), state=state, attempts=attempts,
            last_error=last_error, available_at=RECEIVED, received_at=RECEIVED,
            finished_at=RECEIVED + timedelta(seconds=1) if state in finished else None,
            reason=reason, next_check=next_check, effect_key=effect_key,
            sequence_key=sequence_key, sequence=sequence,
        )
    )  # fmt: skip
    assert result.inserted_primary_key is not None
    return int(result.inserted_primary_key[0])


def set_last(conn: Connection, consumer: str, key: str, last: int) -> None:
    conn.execute(
        SCHEMA.inbox_sequences.insert().values(consumer=consumer, sequence_key=key, last=last)
    )


def last_of(engine: Engine, consumer: str, key: str) -> int | None:
    s = SCHEMA.inbox_sequences.c
    with engine.connect() as conn:
        stmt = select(s.last).where(s.consumer == consumer, s.sequence_key == key)
        value = conn.execute(stmt).scalar()
    return None if value is None else int(value)


def row_of(engine: Engine, row_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(SCHEMA.inbox).where(SCHEMA.inbox.c.id == row_id)).one()


def ledger(engine: Engine) -> dict[tuple[str, str], str]:
    e = SCHEMA.effects.c
    with engine.connect() as conn:
        return {
            (str(c), str(k)): str(ev)
            for c, k, ev in conn.execute(select(e.consumer, e.effect_key, e.event_id))
        }


def marked_groups(engine: Engine) -> set[tuple[str, str]]:
    g = SCHEMA.groups.c
    with engine.connect() as conn:
        stmt = select(g.consumer, g.serial_group).where(g.needs_check.is_(True))
        return {(str(c), str(s)) for c, s in conn.execute(stmt)}


def everything(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables a resolve may write, to compare before and after."""
    tables = [SCHEMA.inbox, SCHEMA.inbox_sequences, SCHEMA.effects, SCHEMA.groups, SCHEMA.audit]
    with engine.connect() as conn:
        return {t.name: sorted(map(tuple, conn.execute(select(t))), key=repr) for t in tables}
