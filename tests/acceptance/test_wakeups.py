"""A group's next message starts at once (not after a poll interval), and on PostgreSQL an idle
worker wakes on the NOTIFY of a commit."""

from __future__ import annotations

import itertools
import signal
import time

import pytest

from tests.acceptance.test_s1_s4_ordering import S1, S1_ORDER, check_serial, store
from tests.support.workers import Bed, pg_listeners, started_order, wait_all, wait_for


def test_the_next_message_of_a_group_starts_at_once(bed: Bed) -> None:
    # Given workers that look for work only every 5 s when idle
    store(bed, S1, "g")
    workers = [bed.spawn(poll_interval=5.0), bed.spawn(poll_interval=5.0)]
    assert wait_all(workers, 120) == [0, 0]
    check_serial(bed, "g", S1_ORDER)
    # Then each message started right after its predecessor ended
    events = [e for e in bed.events() if e.grp == "g"]
    gaps = [b.at - a.at for a, b in itertools.pairwise(events) if a.kind == "end"]
    assert len(gaps) == 6
    assert max(gaps) < 1.0, gaps


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_an_idle_worker_wakes_on_notify(bed: Bed) -> None:
    worker = bed.spawn(stop_when_idle=False, poll_interval=10.0)
    try:
        wait_for(lambda: pg_listeners(bed.engine), 30, "the worker to LISTEN")
        committed = time.time()
        store(bed, [("n", 1)], None)
        wait_for(lambda: "n" in started_order(bed.events()), 5, "the job to start")
        started = next(e.at for e in bed.events() if e.mark == "n")
        assert started - committed < 2.0  # far below the 10 s poll interval
    finally:
        worker.send_signal(signal.SIGTERM)
        assert wait_all([worker], 30) == [0]


def test_a_retry_starts_when_it_falls_due_not_at_the_next_poll(bed: Bed) -> None:
    # Given an idle worker that looks for work every 10 s, and a job whose first run fails
    # with a fixed backoff of 1.5 s
    store(bed, [("r", 1)], None, r={"fail": 1})
    worker = bed.spawn(poll_interval=10.0, backoff=1.5)
    assert wait_all([worker], 60) == [0]
    runs = [e for e in bed.events() if e.mark == "r"]
    ended_first = next(e.at for e in runs if e.kind == "end" and e.attempt == 1)
    started_second = next(e.at for e in runs if e.kind == "start" and e.attempt == 2)
    # Then the second run starts at its due time, well before the next 10 s poll
    assert 1.4 <= started_second - ended_first < 3.0, started_second - ended_first
