"""In-process helpers for the inbox integration tests (one database, no worker process).

The kit drives the worker's engine: ``BatchClaimer`` and ``BatchRunner`` through the worker's
own claim-and-run cycle (``inbox.engine.cycle.ClaimAndRun``), and ``HeadPass`` where the
worker's periodic head-of-group pass would run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine, event, select, update
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage
from inbox.engine.claims import BatchClaimer, Claim
from inbox.engine.cycle import ClaimAndRun
from inbox.engine.heads import Candidate, HeadPass
from inbox.engine.leases import LeaseKeeper
from inbox.engine.marks import mark_groups
from inbox.engine.runner import BatchRunner
from inbox.ingest import InboxIngest
from inbox.settings import Isolation, WorkerOptions
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


@dataclass(frozen=True)
class Mode:
    """How the kit's engine runs: messages per claim (the worker's batch size, N) and how a
    raising handler is kept from the others (its isolation). The default: the worker's."""

    batch_size: int = WorkerOptions.batch_size
    isolation: Isolation = WorkerOptions.isolation

    def __str__(self) -> str:
        return f"n{self.batch_size}-{self.isolation}"


WORKER_MODE = Mode()
# N x isolation, for the tests where a handler raises (retries, halts, permanent errors).
MODES = (Mode(1, "savepoint"), Mode(1, "rerun"), Mode(4, "savepoint"), Mode(4, "rerun"))
# Where no handler raises the isolation never acts: each N once and each isolation once.
PAIRED = (Mode(1, "savepoint"), Mode(4, "rerun"))


@dataclass
class Kit:
    """A consumer recording what its handler ran, with the worker's engine and an ingest."""

    engine: Engine
    consumer: Consumer
    clock: Clock
    claimer: BatchClaimer
    runner: BatchRunner
    heads: HeadPass
    cycle: ClaimAndRun
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

    def claim(self) -> list[Claim]:
        """One claim pass of the worker's cycle (the groups its last batch freed first); the
        claims are held, not run."""
        return self.cycle.claim().claims

    def run(self, claims: Sequence[Claim]) -> list[tuple[Claim, str]]:
        """Run claims as the worker's cycle does; (claim, outcome) as they finished."""
        return self.cycle.run(claims)

    def drain(self, limit: int = 200) -> list[str]:
        """Run the worker's handler loop until nothing is claimable: claim, run, claim again
        (the freed groups first); when a pass claims nothing and leaves no freed group
        undecided, the head-of-group pass that the worker runs now and then. Returns what the
        handler ran, in order."""
        for _ in range(limit):
            result = self.cycle.claim()
            if result.claims:
                self.cycle.run(result.claims)
            elif not self.cycle.freed and not self.heads.head_pass() and not self._left_alone():
                return self.ran
        raise AssertionError("drain did not finish")

    def _left_alone(self) -> bool:
        """A candidate that the last pass neither claimed nor set waiting: its group's lock
        was busy elsewhere for a moment (MariaDB's lock names are server-wide: another test's
        consumer "c1" and group "g" take the same lock, see ``own_group``). The worker would
        try again: so do we."""
        return bool(self.heads.candidates(1))


def make_kit(
    engine: Engine,
    name: str = "c1",
    *,
    mode: Mode = WORKER_MODE,
    job_queue: bool = True,
    broker: bool = False,
    queues: Sequence[str] = ("jobs",),
    **options: Any,
) -> Kit:
    clock = Clock()
    options.setdefault("backoff", Backoff(1.0, 1.0))
    consumer = Consumer(name, queues=list(queues), **options)
    claimer = BatchClaimer(consumer, engine, job_queue=job_queue, broker=broker, clock=clock)
    runner = BatchRunner(consumer, engine, isolation=mode.isolation, clock=clock)
    leases = LeaseKeeper(consumer, engine, clock=clock)
    kit = Kit(
        engine,
        consumer,
        clock,
        claimer,
        runner,
        HeadPass(consumer, engine, job_queue=job_queue, broker=broker, clock=clock),
        ClaimAndRun(claimer, runner, leases, batch_size=mode.batch_size),
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


def own_group() -> str:
    """A group name of this test alone. MariaDB's GET_LOCK names are server-wide: the same
    (consumer, group) in another test's database, run at the same time, holds the same lock,
    and a claimer that finds a group lock busy leaves the group for later."""
    return f"g-{uuid4().hex[:9]}"


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


@contextmanager
def before_the_claim(engine: Engine, change: Callable[[Connection], None]) -> Iterator[None]:
    """Run ``change`` inside the claim pass's own transaction, after its candidates, group
    locks and group reads, right before its conditional ``UPDATE``: a row changed there was
    decided about in a state it is no longer in. (Nothing else can change it there: the
    candidates are row-locked ``SKIP LOCKED``, SQLite's claim holds the write lock; the
    conditional ``UPDATE`` is the last defence, and this is how to reach it.)"""
    fired = False

    def hook(conn: Connection, cursor: Any, statement: str, *_: Any) -> None:
        nonlocal fired
        if fired:
            return
        if statement.lstrip().upper().startswith("UPDATE") and "claimed_at" in statement:
            fired = True
            change(conn)

    event.listen(engine, "before_cursor_execute", hook)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", hook)
    assert fired, "no claim was tried"
