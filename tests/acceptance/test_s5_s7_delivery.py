"""S5-S7 (docs/architecture.md): duplicate delivery, retry policies in a group, a worker
killed mid-handler.
Worker OS processes on every database; assertions on what the database recorded."""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import select

from inbox.engine.claims import BatchClaimer
from inbox.settings import WorkerOptions
from inbox.startup import holds_outbox
from outbox import inbox_table, states
from tests.acceptance.test_s1_s4_ordering import S1, S1_ORDER, check_serial, store
from tests.support.handlers import consumer
from tests.support.workers import (
    Bed,
    completed_order,
    deliver,
    overlaps,
    sigterm_when_ready,
    started_order,
    wait_all,
    wait_for,
)


def _inbox_row(bed: Bed, event_id: Any) -> Any:
    with bed.engine.connect() as conn:
        return conn.execute(select(inbox_table).where(inbox_table.c.event_id == event_id)).one()


def test_s5_duplicate_delivery_has_one_effect(bed: Bed) -> None:
    # Given two running workers
    workers = [bed.spawn(stop_when_idle=False), bed.spawn(stop_when_idle=False)]
    event_id = uuid4()
    envelope = {
        "event_id": event_id,
        "type": "job",
        "queue": "jobs",
        "priority": 1,
        "outbox_id": 1,
        "occurred_at": datetime.now(UTC),
        "body": '{"mark": "once", "sleep": 0.2}',
    }
    ctx = multiprocessing.get_context("spawn")
    try:
        # When the same message is delivered twice at the same instant by two processes
        with ctx.Manager() as manager, ProcessPoolExecutor(2, mp_context=ctx) as pool:
            barrier = manager.Barrier(2)
            futures = [pool.submit(deliver, bed.dsn, envelope, barrier) for _ in range(2)]
            results = sorted(f.result(timeout=60) for f in futures)
        # Then one delivery inserted the row, the other was absorbed as a duplicate
        assert results == [(0, 1), (1, 0)]
        wait_for(lambda: _inbox_row(bed, event_id).state == states.DONE, 60, "the effect")
        # And delivered again later: acknowledged, counted, not run again
        assert deliver(bed.dsn, envelope, None) == (0, 1)
        row = _inbox_row(bed, event_id)
        assert (row.state, row.duplicates) == (states.DONE, 2)
        # Nothing for a claim pass to take (the worker's, as its handler threads claim)
        job_queue = bool(holds_outbox(bed.engine, consumer, None))
        claimer = BatchClaimer(consumer, bed.engine, job_queue=job_queue)
        assert claimer.claim(WorkerOptions.batch_size) == []
    finally:
        for worker in workers:  # SIGTERM: finish and exit 0 (the idle one may still start)
            sigterm_when_ready(worker)
        codes = wait_all(workers, 60)
    assert codes == [0, 0]
    assert [e.mark for e in bed.effects()] == ["once"]
    assert started_order(bed.events()) == ["once"]


def test_s6_block_keeps_the_order_while_the_head_retries(bed: Bed) -> None:
    store(bed, S1, "g", a={"fail": 2, "sleep": 0.03})
    workers = [bed.spawn(on_retry="block", backoff=0.3), bed.spawn(on_retry="block", backoff=0.3)]
    assert wait_all(workers, 90) == [0, 0]
    events = bed.events()
    assert started_order(events, "g") == ["a", "a", "a", *S1_ORDER[1:]]
    check_serial(bed, "g", S1_ORDER)


def test_s6_skip_lets_the_group_continue_and_runs_the_head_when_due(bed: Bed) -> None:
    store(bed, S1, "g", a={"fail": 2, "sleep": 0.03})
    workers = [bed.spawn(on_retry="skip", backoff=0.5), bed.spawn(on_retry="skip", backoff=0.5)]
    assert wait_all(workers, 90) == [0, 0]
    events = bed.events()
    starts = started_order(events, "g")
    # a failed first; b went on at once instead of waiting out a's backoff
    assert starts[:2] == ["a", "b"]
    assert starts.count("a") == 3
    # the others kept their order, a ran to success when due, never beside another
    assert [m for m in completed_order(events, "g") if m != "a"] == [
        m for m in S1_ORDER if m != "a"
    ]
    assert overlaps(events, "g") == []
    assert sorted(e.mark for e in bed.effects()) == sorted(S1_ORDER)


@pytest.mark.slow
def test_s7_worker_killed_mid_handler_holding_a_group(bed: Bed) -> None:
    # Given c2 takes long on its first attempt, and claims live 2 s without a heartbeat
    store(bed, S1, "g", c={"sleep_first": 30, "sleep": 0.03})
    workers = [bed.spawn(visibility=2), bed.spawn(visibility=2)]
    # When the worker running c2 is killed with SIGKILL mid-handler
    started = wait_for(
        lambda: [e for e in bed.events() if e.mark == "c" and e.kind == "start"], 60, "c2"
    )
    victim = started[0].pid
    os.kill(victim, signal.SIGKILL)
    # Then the other worker takes c2 back after the visibility timeout, the group goes on
    codes = {w.pid: w.wait(timeout=90) for w in workers}
    assert codes[victim] == -signal.SIGKILL
    assert [code for pid, code in codes.items() if pid != victim] == [0]
    events = bed.events()
    assert [(e.kind, e.attempt) for e in events if e.mark == "c"] == [
        ("start", 1),
        ("start", 2),
        ("end", 2),
    ]
    killed_at = started[0].at
    rerun = next(e for e in events if e.mark == "c" and e.attempt == 2)
    assert rerun.at - killed_at >= 1.5  # not before the lease ran out
    # Exactly one effect each, nothing of the group overlapped the re-run
    completed = [e for e in events if not (e.mark == "c" and e.attempt == 1)]
    assert overlaps(completed, "g") == []
    assert completed_order(events, "g") == S1_ORDER
    assert sorted(e.mark for e in bed.effects()) == sorted(S1_ORDER)
    assert {r.state for r in _all_rows(bed)} == {states.DONE}


def _all_rows(bed: Bed) -> list[Any]:
    with bed.engine.connect() as conn:
        return list(conn.execute(select(inbox_table)).all())
