"""Consumers for the worker processes the acceptance tests spawn (``outbox worker
tests.support.handlers:consumer``), configured through environment variables.

Every handler run records a ``start`` and an ``end`` event in the recorder database through
its own autocommit connection (so rolled-back and killed runs are recorded too), and writes
its effect through the handler's session (so the effect commits with ``done`` or not at all).
On SQLite the recorder is a separate file: the handler's transaction holds the main file's
write lock.

Each event also carries the message's inbox row as committed at that instant (its id, claim
token, state and lease) and the handler's thread: two runs that overlap can then be traced to
the claims they ran under, and an ``end`` whose token is not its ``start``'s shows the claim
was taken back while the handler ran (see ``claim_seen``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Double,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    Uuid,
    create_engine,
    insert,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from inbox import Consumer, EffectUnknown, InboxMessage
from outbox.backoff import Backoff
from outbox.dsn import normalize
from outbox.schema import schema_for

effects_metadata = MetaData()
effects = Table(
    "test_effects",
    effects_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", Uuid(), nullable=False),
    Column("mark", String(50), nullable=False),
)
events_metadata = MetaData()
events = Table(
    "test_events",
    events_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("mark", String(50), nullable=False),
    Column("grp", String(100), nullable=True),
    Column("kind", String(10), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("at", Double, nullable=False),
    # The inbox row as committed when the event was recorded (NULL on SQLite: see claim_seen).
    Column("row_id", Integer, nullable=True),
    Column("token", String(36), nullable=True),
    Column("row_state", String(20), nullable=True),
    Column("lease", Double, nullable=True),  # its lease_until, epoch seconds
    Column("thread", String(50), nullable=True),
)


class PermanentProblem(Exception):
    """Configured as permanent: fails the message at once."""


_recorder: Engine | None = None


def recorder() -> Engine:
    global _recorder
    if _recorder is None:
        url = os.environ["OUTBOX_TEST_RECORDER"]
        kwargs: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 30}
        _recorder = create_engine(normalize(url), **kwargs)
    return _recorder


def record(message: InboxMessage, kind: str) -> None:
    with recorder().connect() as conn:
        at = time.time()
        conn.execute(
            insert(events).values(
                mark=message.payload["mark"],
                grp=message.serial_group,
                kind=kind,
                pid=os.getpid(),
                attempt=message.attempt,
                at=at,
                thread=threading.current_thread().name[:50],
                **claim_seen(conn, message),
            )
        )


def claim_seen(conn: Connection, message: InboxMessage) -> dict[str, Any]:
    """The message's inbox row as committed now: id, claim token, state, lease.

    Read through the recorder's connection, not the handler's session: the session's
    transaction is at READ COMMITTED and has not written the row, so it would see the same
    committed row, while a read of ours in it would be one more statement the fault tests'
    connection kills could fail (a different run from the one measured). At a ``start`` the
    token is the claim the handler runs under (its claim committed before the run), unless
    another worker took the claim back even before: then two runs show one token. At an
    ``end`` a token other than the start's means the claim was taken back while it ran.
    SQLite: the recorder is another file, the row is not read (the fault suite has none)."""
    if conn.dialect.name == "sqlite":
        return {}
    inbox = schema_for(consumer.config).inbox
    row = conn.execute(
        select(inbox.c.id, inbox.c.claim_token, inbox.c.state, inbox.c.lease_until).where(
            inbox.c.consumer == consumer.name, inbox.c.event_id == message.event_id
        )
    ).first()
    if row is None:
        return {}
    lease = row.lease_until.timestamp() if row.lease_until is not None else None
    token = str(row.claim_token) if row.claim_token is not None else None
    return {"row_id": row.id, "token": token, "row_state": row.state, "lease": lease}


def _wait_for_file(path: str | None, deadline: float = 60.0) -> None:
    """A gate the test opens by creating ``path``: the handler cannot end before the test
    has done what it must do while the handler runs (polled, with a deadline)."""
    if not path:
        return
    give_up = time.monotonic() + deadline
    while not os.path.exists(path):
        if time.monotonic() > give_up:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.01)


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


consumer = Consumer(
    os.environ.get("OUTBOX_TEST_CONSUMER", "test-consumer"),
    queues=json.loads(os.environ.get("OUTBOX_TEST_QUEUES", '["jobs"]')),
    on_retry=os.environ.get("OUTBOX_TEST_ON_RETRY", "block"),  # type: ignore[arg-type]
    on_dead=os.environ.get("OUTBOX_TEST_ON_DEAD", "continue"),  # type: ignore[arg-type]
    max_attempts=int(os.environ.get("OUTBOX_TEST_MAX_ATTEMPTS", "5")),
    # Fixed: the tests know when a retry is due.
    backoff=Backoff.fixed(_env_float("OUTBOX_TEST_BACKOFF", 0.2)),
    permanent_errors=(PermanentProblem,),
    visibility_timeout=_env_float("OUTBOX_TEST_VISIBILITY", 30.0),
    group_lock_timeout=2.0,
    sequence_gap_timeout=_env_float("OUTBOX_TEST_SEQUENCE_GAP", 300.0),
)


def _steps(message: InboxMessage) -> Iterator[float]:
    """The job's behaviour up to its effect, shared by the sync and the async handler: raises
    as configured, yields the pauses to take (each handler sleeps in its own way)."""
    payload = message.payload
    if payload.get("permanent"):
        raise PermanentProblem(f"{payload['mark']} cannot be done")
    if payload.get("unknown"):
        raise EffectUnknown(f"{payload['mark']}: no answer", check=f"look up {payload['mark']}")
    if message.attempt <= int(payload.get("fail", 0)):
        raise RuntimeError(f"{payload['mark']} failed on attempt {message.attempt}")
    yield float(payload.get("sleep", 0.0))
    _wait_for_file(payload.get("hold_until_file"))
    if message.attempt == 1:
        yield float(payload.get("sleep_first", 0.0))


def _effect(message: InboxMessage) -> Insert:
    return insert(effects).values(event_id=message.event_id, mark=message.payload["mark"])


def job(session: Session, message: InboxMessage) -> None:
    """payload: mark, sleep (s), sleep_first (extra on attempt 1), fail (raise on attempts
    <= fail), permanent (bool), unknown (bool: raise EffectUnknown), hold_until_file (the test
    creates it to let the handler end)."""
    record(message, "start")
    try:
        for pause in _steps(message):
            time.sleep(pause)
        session.execute(_effect(message))
    finally:
        record(message, "end")


async def async_job(session: AsyncSession, message: InboxMessage) -> None:
    """``job`` as an async handler (OUTBOX_TEST_ASYNC=1): it awaits its pauses and its
    effect on the worker's event loop. Appends its pid to OUTBOX_TEST_ASYNC_SEEN, so a test
    knows the async handler is the one that ran."""
    seen = os.environ.get("OUTBOX_TEST_ASYNC_SEEN")
    if seen:
        with open(seen, "a") as out:
            out.write(f"{os.getpid()}\n")
    record(message, "start")
    try:
        for pause in _steps(message):
            await asyncio.sleep(pause)
        await session.execute(_effect(message))
    finally:
        record(message, "end")


if os.environ.get("OUTBOX_TEST_ASYNC") == "1":
    consumer.handler("job")(async_job)
else:
    consumer.handler("job")(job)
