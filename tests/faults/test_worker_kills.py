"""Workers SIGKILLed at random instants, one of them inside a grouped handler (S7 at scale),
on PostgreSQL and MariaDB, with the database source, RabbitMQ and Kafka.

A producer stores while the workers run, so kills land while messages are received, claimed
and handled. Every kill is followed by a fresh worker. A killed claim comes back after the
visibility timeout; the verdict is read from the database (tests/faults/tally.py): nothing
lost, one effect per message, no overlap inside a group, and the duplicates the inbox
absorbed (broker messages received but not yet acknowledged by a killed worker).
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from outbox import states
from tests.faults.tally import measure, runs_from, tally
from tests.faults.worker_harness import (
    SOURCES,
    FaultBed,
    Producer,
    fault_bed,
    load,
    random_pause,
    trap_event_id,
)
from tests.support.workers import Bed, wait_for

WORKERS = 3
VISIBILITY = 3.0
TRAP = "trap"
TOTAL = 1200
# Kills per source. Kafka: a killed member keeps its partitions for the session timeout
# (6 s) and every restart rebalances the group, so fewer kills fit the time budget.
KILLS = {"database": 10, "rabbitmq": 10, "kafka": 4}


def _respawn(faults: FaultBed) -> None:
    faults.spawn_worker(visibility=VISIBILITY, max_attempts=10)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_workers_sigkilled_mid_handler_lose_and_double_nothing(
    request: pytest.FixtureRequest, bed: Bed, dialect: str, source: str, tmp_path: Path
) -> None:
    rng = random.Random()
    total, planned = TOTAL, KILLS[source]
    began = time.monotonic()
    with fault_bed(request, bed, dialect, source, tmp_path) as faults:
        for _ in range(WORKERS):
            _respawn(faults)
        faults.start_relays(1)
        producer = Producer(faults, load(faults.queue, total, traps=[TRAP])).start()

        # The trap heads group g0 and hangs on its first run: kill the worker inside it
        first = wait_for(lambda: faults.starts(TRAP), 90, "the trap to start")[0]
        lease = faults.lease_until(trap_event_id(faults.queue, TRAP))
        faults.kill_worker(next(w for w in faults.workers if w.pid == first.pid))
        _respawn(faults)
        kills = 1
        # Then random workers at random instants, spread over the progress of the run
        while kills < planned:
            due = total * kills // planned
            wait_for(faults.reached(due), 120, f"{due} messages finished")
            random_pause(rng, 0.0, 0.3)
            faults.kill_worker(rng.choice(faults.workers))
            _respawn(faults)
            kills += 1
        producer.join()
        wait_for(lambda: faults.finished() == total, 180, "every message finished")
        codes = faults.stop_all()
        result = measure(faults)
        trap_runs = [(s.attempt, s.at) for s in faults.starts(TRAP)]
    seconds = round(time.monotonic() - began)
    print(
        "\n"
        + result.line(
            "worker-kill", dialect, source, kills=kills, killed_in_handler=result.killed_in_handler
        )
        + f" failed={result.failed} seconds={seconds}"
    )
    assert codes == [0] * len(codes)  # the survivors and the relay stopped cleanly
    assert result.problems() == []
    assert (result.stored, result.done + result.failed) == (total, total)
    # The trap ran again only once the killed claim's lease ran out (the lease read before
    # the kill, or a later one a heartbeat renewed), and its re-run took effect (not lost)
    assert [attempt for attempt, _ in trap_runs][:2] == [1, 2]
    assert trap_runs[1][1] >= lease
    assert result.killed_in_handler >= 1


def test_the_verdict_catches_loss_doubles_and_overlaps() -> None:
    """The checks can fail: fabricated bad outcomes are each reported."""
    a, b, c, d, e, f = (uuid.uuid4() for _ in range(6))

    def row(event_id: uuid.UUID, state: str, error: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(event_id=event_id, state=state, last_error=error, duplicates=1)

    inbox = [
        row(a, states.DONE),  # fine
        row(b, states.DONE),  # done twice over: two effects
        row(c, states.FAILED),  # failed without a reason: lost
        row(d, states.PROCESSING),  # never finished: lost
        row(f, states.DONE),  # done without its effect: lost
    ]  # e: never received
    effects = [a, b, b]

    def event(mark: str, kind: str, at: float, pid: int, attempt: int = 1) -> SimpleNamespace:
        return SimpleNamespace(mark=mark, grp="g", kind=kind, at=at, pid=pid, attempt=attempt)

    events = [
        event("x", "start", 1.0, pid=7),  # killed at 5.0: its run ends then
        event("y", "start", 4.0, pid=8),  # started before the kill: an overlap
        event("y", "end", 4.5, pid=8),
        event("z", "start", 6.0, pid=9),  # never ended, never killed: overlaps what follows
        event("w", "start", 9.0, pid=8),
        event("w", "end", 9.5, pid=8),
    ]
    result = tally([a, b, c, d, e, f], inbox, effects, runs_from(events, {7: 5.0}))
    assert sorted(result.lost) == sorted(str(x) for x in (c, d, e, f))
    assert result.double == [str(b)]
    assert result.overlaps == [("x", "y"), ("z", "w")]
    assert (result.duplicates, result.killed_in_handler) == (5, 1)
    assert len(result.problems()) == 3
    line = result.line("worker-kill", "postgresql", "rabbitmq", kills=1)
    assert line == (
        "FAULT worker-kill pg rabbitmq: stored=6 done=3 lost=4 double=1 overlaps=2"
        " duplicates_absorbed=5 kills=1"
    )
    # and a clean outcome passes
    clean = tally([a], [row(a, states.DONE)], [a], runs_from(events[1:3], {}))
    assert clean.problems() == []
