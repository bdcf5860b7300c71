"""The relays' and workers' database connections killed from the server side, repeatedly,
while they work: ``pg_terminate_backend`` on PostgreSQL, ``KILL CONNECTION`` on MariaDB; with
the database source, RabbitMQ and Kafka.

Relays (``application_name`` / user ``fr_...``) and workers (``fw_...``) are told apart by the
names they connect under (worker_harness.FaultBed); the test's own connections and the
handler's interval recorder are never killed. Each round kills one relay and one worker
connection, preferring one inside a statement or transaction (mid-batch, mid-claim,
mid-handler). The processes must reconnect by themselves and stop cleanly at the end, and
the database must show nothing lost, nothing doubled, no overlap inside a group.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.tally import measure
from tests.faults.worker_harness import (
    SOURCES,
    FaultBed,
    Producer,
    fault_bed,
    load,
    random_pause,
)
from tests.support.workers import Bed, wait_for

WORKERS = 3
RELAYS = 2
TOTAL = 1200
# Kill rounds, spread over the first 90% of the run: the tail shows the processes recovered
# by themselves. Each round kills one relay and one worker connection.
ROUNDS = 15


def _kill_one(faults: FaultBed, role: str, rng: random.Random, tally: Counter[str]) -> None:
    """Kill one connection of ``role``, a busy one if there is one."""
    connections = faults.connections(role)
    busy = [c for c, is_busy in connections if is_busy]
    pool = busy or [c for c, _ in connections]
    if pool and faults.kill_connection(rng.choice(pool), role):
        tally[role] += 1
        tally["busy"] += bool(busy)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_killed_connections_lose_and_double_nothing(
    request: pytest.FixtureRequest, bed: Bed, dialect: str, source: str, tmp_path: Path
) -> None:
    rng = random.Random()
    total = TOTAL
    kills: Counter[str] = Counter()
    began = time.monotonic()
    with fault_bed(request, bed, dialect, source, tmp_path) as faults:
        for _ in range(WORKERS):
            faults.spawn_worker(visibility=3.0, max_attempts=20)
        faults.start_relays(RELAYS)
        producer = Producer(faults, load(faults.queue, total)).start()
        roles = ["worker"] if faults.broker_url is None else ["relay", "worker"]
        for round_ in range(ROUNDS):
            due = int(total * 0.9 * round_ / ROUNDS)
            wait_for(faults.reached(due), 120, f"{due} messages finished")
            random_pause(rng, 0.0, 0.3)
            for role in roles:
                _kill_one(faults, role, rng, kills)
        producer.join()
        wait_for(lambda: faults.finished() == total, 180, "every message finished")
        codes = faults.stop_all()
        result = measure(faults)
    seconds = round(time.monotonic() - began)
    print(
        "\n"
        + result.line(
            "connection-kill",
            dialect,
            source,
            kills=kills["relay"] + kills["worker"],
            relay_kills=kills["relay"],
            worker_kills=kills["worker"],
            busy_kills=kills["busy"],
            taken_back=result.taken_back,
        )
        + ("" if result.lease_margin is None else f" lease_margin={result.lease_margin:.3f}s")
        + f" failed={result.failed} seconds={seconds}"
    )
    # every worker and relay survived and stopped cleanly
    assert codes == [0] * len(codes), faults.evidence(result)
    assert result.problems() == [], faults.evidence(result)
    assert (result.stored, result.done + result.failed) == (total, total)
    # (a round finds no connection of a role only in the instant it reconnects)
    assert kills["worker"] >= ROUNDS // 2
    assert faults.broker_url is None or kills["relay"] >= ROUNDS // 2
