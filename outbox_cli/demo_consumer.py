"""The consumer half of ``outbox demo``: two worker processes run scenario S1's jobs.

``consumer`` handles the demo's ``transcribe.recording`` jobs: each records, in the same
transaction that marks it done, which process ran it and when. ``run_workers`` starts
``outbox worker outbox_cli.demo_consumer:consumer`` twice on the demo database, waits for
both to go idle, and returns the order the jobs ran in (S1: a b d e g c f).

With a broker the demo runs on a queue of its own (``OUTBOX_DEMO_QUEUE``, read when this
module is imported, so the worker processes the demo starts see the same name): leftovers of
an earlier run, or another demo on the same broker, never mix into this one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Column, Engine, Float, Integer, MetaData, String, Table, insert, select
from sqlalchemy.orm import Session

from inbox.consumer import Consumer, InboxMessage
from outbox import dsn as dsn_mod
from outbox.config import OutboxConfig

QUEUE_ENV = "OUTBOX_DEMO_QUEUE"
CONSUMER_ENV = "OUTBOX_DEMO_CONSUMER"
TARGET = "outbox_cli.demo_consumer:consumer"

_metadata = MetaData()
processed = Table(
    "demo_processed",
    _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("mark", String(20), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started", Float, nullable=False),
    Column("finished", Float, nullable=False),
)

# S1 uses priorities 1 and 2 only: a broker source then consumes two queues, not nine.
consumer = Consumer(
    os.environ.get(CONSUMER_ENV) or "demo",
    queues=[os.environ.get(QUEUE_ENV) or "transcribe"],
    config=OutboxConfig(min_priority=1, max_priority=2),
)


@consumer.handler("transcribe.recording")
def transcribe(session: Session, message: InboxMessage) -> None:
    started = time.time()
    time.sleep(0.2)  # the "work": long enough for the other worker to try the group
    session.execute(
        insert(processed).values(
            mark=message.payload["mark"],
            priority=message.priority,
            pid=os.getpid(),
            started=started,
            finished=time.time(),
        )
    )


@dataclass(frozen=True)
class Run:
    mark: str
    priority: int
    pid: int
    started: float
    finished: float


def prepare(engine: Engine) -> None:
    """Create the table the handler writes to (the demo application's own)."""
    _metadata.create_all(engine)


def read_runs(engine: Engine) -> list[Run]:
    """Every recorded run, in the order the runs committed."""
    with engine.connect() as conn:
        rows = conn.execute(select(processed).order_by(processed.c.id)).all()
    return [Run(r.mark, r.priority, r.pid, r.started, r.finished) for r in rows]


def child_env(**settings: str) -> dict[str, str]:
    """The environment of a demo process: ours without any ``OUTBOX_*`` setting the user may
    have exported (a metrics port, a queue, a time limit ... meant for their own processes),
    plus ``settings``. Secrets travel here rather than on a command line anyone can ``ps``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(settings)
    return env


def worker_command(*extra: str) -> list[str]:
    """``outbox worker`` on the demo's consumer with the demo's settings, plus ``extra``."""
    return [
        sys.executable, "-m", "outbox_cli", "worker", TARGET,
        "--poll-interval", "0.1", "--log-level", "WARNING", *extra,
    ]  # fmt: skip


def run_workers(dsn: str, workers: int = 2, time_limit: float = 120.0) -> list[Run]:
    """Run ``workers`` worker processes until idle; the jobs in the order they ran."""
    engine = dsn_mod.make_engine(dsn)
    prepare(engine)
    command = worker_command("--stop-when-idle", "--time-limit", str(time_limit))
    env = child_env(OUTBOX_DSN=dsn)
    processes = [subprocess.Popen(command, env=env) for _ in range(workers)]
    for process in processes:
        process.wait(timeout=time_limit + 30)
    runs = read_runs(engine)
    engine.dispose()
    return runs


def overlapping(runs: Sequence[Run]) -> bool:
    """Did two runs ever overlap in time (two of the group at once)?"""
    return any(
        a.started < b.finished and b.started < a.finished
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
    )
