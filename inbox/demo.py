"""The consumer half of ``outbox demo``: two worker processes run scenario S1's jobs.

``consumer`` handles the demo's ``transcribe.recording`` jobs: each records, in the same
transaction that marks it done, which process ran it and when. ``run_workers`` starts
``outbox worker inbox.demo:consumer`` twice on the demo database, waits for both to go idle,
and returns the order the jobs ran in (S1: a b d e g c f).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert, select
from sqlalchemy.orm import Session

from inbox.consumer import Consumer, InboxMessage
from outbox import dsn as dsn_mod

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

consumer = Consumer("demo", queues=["transcribe"])


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


def run_workers(dsn: str, workers: int = 2, time_limit: float = 120.0) -> list[Run]:
    """Run ``workers`` worker processes until idle; the jobs in the order they ran."""
    engine = dsn_mod.make_engine(dsn)
    _metadata.create_all(engine)
    command = [
        sys.executable, "-m", "outbox.cli", "worker", "inbox.demo:consumer", "--dsn", dsn,
        "--stop-when-idle", "--poll-interval", "0.1", "--time-limit", str(time_limit),
        "--log-level", "WARNING",
    ]  # fmt: skip
    processes = [subprocess.Popen(command) for _ in range(workers)]
    for process in processes:
        process.wait(timeout=time_limit + 30)
    with engine.connect() as conn:
        rows = conn.execute(select(processed).order_by(processed.c.id)).all()
    engine.dispose()
    return [Run(r.mark, r.priority, r.pid, r.started, r.finished) for r in rows]
