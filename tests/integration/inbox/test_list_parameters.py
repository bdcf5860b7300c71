"""The batch statements' lists (ids, tokens, groups) on each database: on PostgreSQL one array
parameter, so the statement's text is the same whatever the batch's size (psycopg converts the
query once and caches it, the server prepares one statement); elsewhere an expanding ``IN``.
An empty list matches no row either way, and a list longer than psycopg's cache takes (50
parameters) gives the same text as a short one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import uuid4

from sqlalchemy import Connection, Engine, event, insert, select

from inbox.sql import claims as q
from inbox.sql import groups as queries_groups
from inbox.sql import heads as queries_heads
from outbox import states
from outbox.clock import utcnow
from outbox.dialect import dialect_of
from outbox.schema import schema_for

ROWS = 60  # more values than psycopg converts a query once for
SCHEMA = schema_for()
INBOX = SCHEMA.inbox


@contextmanager
def sent_texts(engine: Engine) -> Iterator[list[str]]:
    """The SQL text of each statement the driver is handed inside the block (but SQLite's
    ``BEGIN IMMEDIATE``)."""
    texts: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.startswith("BEGIN"):
            texts.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield texts
    finally:
        event.remove(engine, "before_cursor_execute", record)


def fill(engine: Engine) -> tuple[Any, list[int], list[int]]:
    """ROWS rows claimed under one token, ROWS ready ones, ROWS marked groups."""
    token, now = uuid4(), utcnow()

    def row(index: int, state: str) -> dict[str, Any]:
        processing = state == states.PROCESSING
        return {
            "event_id": uuid4(),
            "consumer": "c",
            "queue": "q",
            "priority": 1,
            "seq": index,
            "type": "t",
            "payload": "{}",
            "headers": "{}",
            "state": state,
            "claim_token": token if processing else None,
            "lease_until": now + timedelta(hours=1) if processing else None,
            "available_at": now - timedelta(seconds=1),
            "received_at": now,
        }

    marks = [{"consumer": "c", "serial_group": f"g{i}", "needs_check": True} for i in range(ROWS)]
    with engine.begin() as conn:
        conn.execute(insert(INBOX), [row(i, states.PROCESSING) for i in range(ROWS)])
        conn.execute(insert(INBOX), [row(i, states.READY) for i in range(ROWS)])
        conn.execute(insert(SCHEMA.groups), marks)
        by_state = conn.execute(select(INBOX.c.id, INBOX.c.state).order_by(INBOX.c.id)).all()
    held = [r.id for r in by_state if r.state == states.PROCESSING]
    ready = [r.id for r in by_state if r.state == states.READY]
    return token, held, ready


def changed(conn: Connection, statement: Any, parameters: dict[str, Any]) -> int:
    """How many rows ``statement`` matched, its changes rolled back."""
    with conn.begin() as transaction:
        result = conn.execute(statement, parameters)
        count = len(result.all()) if result.returns_rows else result.rowcount
        transaction.rollback()
    return int(count)


def test_lists_of_any_length_including_none(engine: Engine) -> None:
    dialect = dialect_of(engine)
    arrays = dialect.arrays
    token, held, ready = fill(engine)
    now = utcnow()
    groups = [f"g{i}" for i in range(ROWS)]
    texts: dict[str, set[str]] = {}
    for size in (0, 1, ROWS):
        ids, fresh, names = held[:size], ready[:size], groups[:size]
        checks: dict[str, tuple[Any, dict[str, Any]]] = {
            "still_held": (q.still_held(INBOX, arrays=arrays), {"ids": ids, "token": token}),
            "load_claimed": (q.load_claimed(INBOX, arrays=arrays), {"ids": ids, "token": token}),
            "finish_done_many": (
                q.finish_done_many(INBOX, arrays=arrays),
                {"ids": ids, "token": token, "now": now},
            ),
            "renew_leases": (
                q.renew_leases(INBOX, arrays=arrays),
                {"ids": ids, "tokens": [token] if size else [], "lease_until": now},
            ),
            "claim_many": (
                q.claim_many(INBOX, dialect.returning, arrays=arrays),
                {"ids": fresh, "fresh": fresh, "resumed": [], "token": uuid4()}
                | {"now": now, "lease_until": now},
            ),
            "mark_waiting_many": (
                q.mark_waiting_many(INBOX, arrays=arrays),
                {"ids": fresh, "now": now},
            ),
            "clear": (
                queries_groups.clear(SCHEMA.groups, arrays=arrays),
                {"of_consumer": "c", "groups": names},
            ),
        }
        if dialect.row_locks:
            checks["lock_rows"] = (q.lock_rows(INBOX, arrays=arrays), {"ids": fresh})
        with engine.connect() as conn:
            for name, (statement, parameters) in checks.items():
                with sent_texts(engine) as sent:
                    assert changed(conn, statement, parameters) == size, (name, size)
                texts.setdefault(name, set()).update(sent)
            among = queries_heads.waiting_heads_among(INBOX, False, arrays=arrays)
            with sent_texts(engine) as sent:
                found = conn.execute(among, {"consumer": "c", "now": now, "groups": names})
                assert found.all() == []  # no row waits
            texts.setdefault("waiting_heads_among", set()).update(sent)
    for name, seen in texts.items():
        if arrays:
            assert len(seen) == 1, (name, seen)
            assert "= ANY (" in next(iter(seen)), (name, seen)
        else:
            assert all(" IN (" in text for text in seen), (name, seen)
