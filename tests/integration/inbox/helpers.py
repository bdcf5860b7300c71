"""In-process helpers for the inbox integration tests (one database, no worker process)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage
from inbox.engine.heads import Candidate, Claimer
from inbox.engine.marks import mark_groups
from inbox.engine.outcomes import Runner
from inbox.ingest import InboxIngest
from inbox.sources.database import DatabaseSource
from outbox import Message, inbox_table, store_many
from outbox.backoff import Backoff
from outbox.clock import utcnow
from outbox.schema import groups_table

S1 = [("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 2), ("g", 1)]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC) + timedelta(seconds=1)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Kit:
    """A consumer recording what its handler ran, with claimer, runner and ingest."""

    engine: Engine
    consumer: Consumer
    clock: Clock
    claimer: Claimer
    runner: Runner
    ingest: InboxIngest
    ran: list[str] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)
    during: Callable[[InboxMessage], None] | None = None

    def take_outbox(self) -> int:
        """Move what is due from the outbox into the inbox. Due by the later of the kit's clock
        and the wall clock: ``store`` stamps rows with the wall clock, which a loaded machine
        moves past the kit's (set once, when the kit was made) between two steps of a test,
        and a row left behind would then block its group as an undelivered predecessor."""
        source = DatabaseSource(
            self.engine, self.consumer.queues, clock=lambda: max(self.clock(), utcnow())
        )
        return source._take(self.ingest, 1000)

    def drain(self, limit: int = 200) -> list[str]:
        """Claim and run one message at a time until nothing is claimable."""
        for _ in range(limit):
            claim = self.claimer.claim_next()
            if claim is None:
                return self.ran
            self.runner.run(claim)
        raise AssertionError("drain did not finish")


def make_kit(
    engine: Engine,
    name: str = "c1",
    *,
    job_queue: bool = True,
    queues: Sequence[str] = ("jobs",),
    **options: Any,
) -> Kit:
    clock = Clock()
    options.setdefault("backoff", Backoff(1.0, 1.0))
    consumer = Consumer(name, queues=list(queues), **options)
    claimer = Claimer(consumer, engine, job_queue=job_queue, clock=clock)
    kit = Kit(
        engine,
        consumer,
        clock,
        claimer,
        Runner(consumer, engine, claimer, clock=clock),
        InboxIngest(consumer, engine, clock=clock),
    )

    @consumer.handler("job")
    def job(session: Session, message: InboxMessage) -> None:
        mark = message.payload["mark"]
        kit.ran.append(mark)
        if kit.during is not None:
            kit.during(message)
        if kit.fail.get(mark, 0) >= message.attempt:
            raise RuntimeError(f"{mark} fails on attempt {message.attempt}")

    return kit


def store_jobs(
    engine: Engine, jobs: Sequence[tuple[str, int]], group: str | None = "g", **extra: Any
) -> list[UUID]:
    with engine.begin() as conn:
        return store_many(
            conn,
            [
                Message(
                    queue=extra.get("queue", "jobs"),
                    type=extra.get("type", "job"),
                    payload={"mark": mark},
                    priority=priority,
                    serial_group=group,
                )
                for mark, priority in jobs
            ],
        )


def rows(engine: Engine, consumer: str = "c1") -> dict[str, Any]:
    """Inbox rows of the consumer by mark."""
    t = inbox_table
    with engine.connect() as conn:
        found = conn.execute(select(t).where(t.c.consumer == consumer).order_by(t.c.id)).all()
    return {(r.payload or {}).get("mark", str(r.event_id)): r for r in found}


def set_state(engine: Engine, row_id: int, state: str, **values: Any) -> None:
    """Set a row's state by hand, marking its group for the head pass as every transaction
    of the engine that changes a group's rows does (``inbox/engine/marks.py``)."""
    with engine.begin() as conn:
        conn.execute(
            update(inbox_table).where(inbox_table.c.id == row_id).values(state=state, **values)
        )
        row = conn.execute(
            select(inbox_table.c.consumer, inbox_table.c.serial_group).where(
                inbox_table.c.id == row_id
            )
        ).one()
        mark_groups(conn, groups_table, row.consumer, [row.serial_group])


def candidate(row: Any) -> Candidate:
    return Candidate(row.id, row.serial_group, row.priority, row.seq, row.state)
