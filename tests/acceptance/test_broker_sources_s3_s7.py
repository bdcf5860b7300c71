"""S3-S7 (docs/architecture.md) through the relay and a real broker (RabbitMQ, Kafka) on PostgreSQL.

The database-source versions are in test_s1_s4_ordering.py and test_s5_s7_delivery.py; these
run the same scenarios, with the same assertions on what the handlers recorded, in the
job-queue deployment with a broker: workers spawned with ``--source <broker>``, the outbox
rows published by ``outbox relay`` processes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import func, select, text

from inbox.rules import expected_order
from outbox import Message, inbox_table, outbox_table, states, store_many
from outbox.transport import Outgoing
from outbox.wire import Envelope
from relay.publishers import publisher_from_url
from relay.relay import envelope_of
from tests.acceptance.test_broker_sources import BrokerRun, broker_workers
from tests.acceptance.test_s1_s4_ordering import S1, S1_ORDER, check_serial, max_concurrency, store
from tests.support import services
from tests.support.kafka import KafkaBroker
from tests.support.workers import Bed, completed_order, overlaps, started_order, wait_for

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)


@pytest.fixture(params=["rabbitmq", "kafka"])
def broker(request: pytest.FixtureRequest) -> str:
    """The broker URL: RabbitMQ, or the session's Kafka-protocol broker."""
    if request.param == "kafka":
        kafka: KafkaBroker = request.getfixturevalue("kafka_broker")
        return kafka.url
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")
    return services.RABBITMQ_URL


@pytest.mark.parametrize("h1", ["received_while_c2_runs", "in_flight_when_c2_ends", "unsent"])
def test_s3_late_urgent_message_goes_before_f2_without_interrupting_c2(
    bed: Bed, broker: str, h1: str
) -> None:
    with (
        broker_workers(bed, broker) as run,
        _gate(bed, "test_effects", "c") as finish_c2,
        _gate(bed, "inbox", "h") as receive_h1,
    ):
        # Given S1 published, where c2 runs until the test lets its effect commit
        store(bed, S1, "g", queue=run.queue)
        run.relay()
        # When h1 is stored while c2 runs
        wait_for(lambda: "c" in started_order(bed.events()), 60, "c2 to start")
        store(bed, [("h", 1)], "g", queue=run.queue)
        stored_at = time.time()
        # ... and c2 ends when h1 is in the inbox, or at the broker (published, a worker
        # waits to ingest it), or still pending in the outbox
        if h1 == "received_while_c2_runs":
            receive_h1()
            run.relay()
            wait_for(lambda: _received(bed, run) == len(S1) + 1, 60, "h1 in the inbox")
            finish_c2()
        else:
            if h1 == "in_flight_when_c2_ends":
                run.relay()
                assert _received(bed, run) == len(S1)
            finish_c2()
            wait_for(lambda: _state(bed, run, "c") == states.DONE, 60, "c2 to finish")
            wait_for(lambda: _state(bed, run, "f") == states.WAITING, 60, "f2 held back")
            receive_h1()
            if h1 == "unsent":
                run.relay()
        run.wait_done(len(S1) + 1)
    assert run.codes == [0, 0]
    # Then h1 runs after c2 (never beside it), before f2; c2 ran once, to its end
    check_serial(bed, "g", ["a", "b", "d", "e", "g", "c", "h", "f"])
    c_runs = [e for e in bed.events() if e.mark == "c"]
    assert [e.kind for e in c_runs] == ["start", "end"]
    assert c_runs[0].at < stored_at < c_runs[1].at


def test_s4_groups_stay_serial_and_ungrouped_jobs_never_wait(bed: Bed, broker: str) -> None:
    g1 = [("p1", 2), ("p2", 1), ("p3", 3), ("p4", 1), ("p5", 2)]
    g2 = [("q1", 1), ("q2", 3), ("q3", 1), ("q4", 2), ("q5", 1)]
    # Group runs last longer than ungrouped ones: "never wait" has a margin to show in
    slow = {"sleep": 0.3}
    with broker_workers(bed, broker, concurrency=3) as run:
        # The two groups' stores interleaved, ungrouped jobs in between
        for (m1, p1), (m2, p2) in zip(g1, g2, strict=True):
            with bed.engine.begin() as conn:
                store_many(
                    conn,
                    [
                        Message(run.queue, "job", {"mark": m1, **slow}, p1, serial_group="G1"),
                        Message(run.queue, "job", {"mark": m2, **slow}, p2, serial_group="G2"),
                        Message(run.queue, "job", {"mark": "u" + m1, "sleep": 0.15}, priority=3),
                    ],
                )
        run.relay()
        run.wait_done(15)
    assert run.codes == [0, 0]
    events = bed.events()
    # The groups: serial, each in its own (priority, insertion) order
    assert overlaps(events, "G1") == [] and overlaps(events, "G2") == []
    assert completed_order(events, "G1") == expected_order(g1)
    assert completed_order(events, "G2") == expected_order(g2)
    # The two groups ran side by side, and ungrouped jobs did not wait for them
    ungrouped = [e for e in events if e.grp is None]
    assert len([e for e in ungrouped if e.kind == "start"]) == 5
    last_group_start = max(e.at for e in events if e.grp is not None and e.kind == "start")
    assert max(e.at for e in ungrouped if e.kind == "start") < last_group_start
    assert max_concurrency(events) >= 3
    assert len(bed.effects()) == 15


def test_s5_duplicate_delivery_has_one_effect(bed: Bed, broker: str) -> None:
    with broker_workers(bed, broker) as run:
        # Given a committed outbox row, still pending
        store(bed, [("once", 1)], None, queue=run.queue, once={"sleep": 0.2})
        envelope = _envelope_of_the_only_row(bed)
        # When it reaches the broker twice at once (two copies in one batch: RabbitMQ hands
        # them round-robin to the two workers, Kafka to the owners of their partitions) ...
        _publish_twice(run.broker, envelope)
        wait_for(lambda: _done_row(bed, run, envelope), 60, "the effect")
        wait_for(lambda: _inbox_row(bed, run, envelope).duplicates == 1, 60, "a duplicate")
        # ... and once more later, from the relay (the row was still pending)
        run.relay()
        wait_for(lambda: _inbox_row(bed, run, envelope).duplicates == 2, 60, "the third copy")
    assert run.codes == [0, 0]
    # Then one delivery inserted the row, the others were counted, nothing ran twice
    row = _inbox_row(bed, run, envelope)
    assert (row.state, row.duplicates, row.attempts) == (states.DONE, 2, 1)
    assert [e.mark for e in bed.effects()] == ["once"]
    assert started_order(bed.events()) == ["once"]
    with bed.engine.connect() as conn:
        assert conn.execute(select(outbox_table.c.status)).scalar_one() == states.SENT


@pytest.mark.parametrize("policy", ["block", "skip"])
def test_s6_head_fails_twice_then_succeeds(bed: Bed, broker: str, policy: str) -> None:
    backoff = 0.3 if policy == "block" else 0.5
    with broker_workers(bed, broker, on_retry=policy, backoff=backoff) as run:
        store(bed, S1, "g", queue=run.queue, a={"fail": 2, "sleep": 0.03})
        run.relay()
        run.wait_done(len(S1))
    assert run.codes == [0, 0]
    CHECKS[policy](bed)


def _block_keeps_the_order(bed: Bed) -> None:
    assert started_order(bed.events(), "g") == ["a", "a", "a", *S1_ORDER[1:]]
    check_serial(bed, "g", S1_ORDER)


def _skip_lets_the_group_continue(bed: Bed) -> None:
    events = bed.events()
    starts = started_order(events, "g")
    # a failed first; b went on at once instead of waiting out a's backoff
    assert starts[:2] == ["a", "b"]
    assert starts.count("a") == 3
    # the others kept their order, a ran to success when due, never beside another
    others = [m for m in S1_ORDER if m != "a"]
    assert [m for m in completed_order(events, "g") if m != "a"] == others
    assert overlaps(events, "g") == []
    assert sorted(e.mark for e in bed.effects()) == sorted(S1_ORDER)


CHECKS: dict[str, Callable[[Bed], None]] = {
    "block": _block_keeps_the_order,
    "skip": _skip_lets_the_group_continue,
}


@pytest.mark.slow
def test_s7_worker_killed_mid_handler_holding_a_group(bed: Bed, broker: str) -> None:
    # Given c2 takes long on its first attempt, and claims live 2 s without a heartbeat
    with broker_workers(bed, broker, visibility=2) as run:
        store(bed, S1, "g", queue=run.queue, c={"sleep_first": 30, "sleep": 0.03})
        run.relay()
        # When the worker running c2 is killed with SIGKILL mid-handler
        started = wait_for(
            lambda: [e for e in bed.events() if e.mark == "c" and e.kind == "start"], 60, "c2"
        )
        victim = started[0].pid
        os.kill(victim, signal.SIGKILL)
        # Then the other worker takes c2 back after the visibility timeout, the group goes on
        run.wait_done(len(S1))
    codes = {w.pid: code for w, code in zip(run.workers, run.codes, strict=True)}
    assert codes[victim] == -signal.SIGKILL
    assert [code for pid, code in codes.items() if pid != victim] == [0]
    events = bed.events()
    assert [(e.kind, e.attempt) for e in events if e.mark == "c"] == [
        ("start", 1),
        ("start", 2),
        ("end", 2),
    ]
    rerun = next(e for e in events if e.mark == "c" and e.attempt == 2)
    assert rerun.pid != victim
    assert rerun.at - started[0].at >= 1.5  # not before the lease ran out
    # Exactly one effect each, nothing of the group overlapped the re-run
    completed = [e for e in events if not (e.mark == "c" and e.attempt == 1)]
    assert overlaps(completed, "g") == []
    assert completed_order(events, "g") == S1_ORDER
    assert sorted(e.mark for e in bed.effects()) == sorted(S1_ORDER)
    with bed.engine.connect() as conn:
        assert set(conn.execute(select(inbox_table.c.state)).scalars()) == {states.DONE}


# -- helpers -----------------------------------------------------------------------------


def _envelope_of_the_only_row(bed: Bed) -> Envelope:
    """The outbox row as the relay publishes it (the relay's own conversion)."""
    with bed.engine.connect() as conn:
        return envelope_of(conn.execute(select(outbox_table)).mappings().one())


def _publish_twice(broker: str, envelope: Envelope) -> None:
    publisher = publisher_from_url(broker)
    try:
        publisher.connect()
        # Two copies: the row ids only tell their confirms apart
        assert publisher.publish([Outgoing(1, envelope), Outgoing(2, envelope)]) == {
            1: None,
            2: None,
        }
    finally:
        publisher.close()


def _received(bed: Bed, run: BrokerRun) -> int:
    with bed.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(inbox_table.c.consumer == run.consumer)
            ).scalar_one()
        )


def _inbox_row(bed: Bed, run: BrokerRun, envelope: Envelope) -> Any:
    with bed.engine.connect() as conn:
        return conn.execute(
            select(inbox_table).where(
                inbox_table.c.event_id == envelope.event_id,
                inbox_table.c.consumer == run.consumer,
            )
        ).one_or_none()


def _done_row(bed: Bed, run: BrokerRun, envelope: Envelope) -> Any:
    row = _inbox_row(bed, run, envelope)
    return row if row is not None and row.state == states.DONE else None


def _state(bed: Bed, run: BrokerRun, mark: str) -> str | None:
    with bed.engine.connect() as conn:
        return conn.execute(
            text("SELECT state FROM inbox WHERE consumer = :consumer AND payload->>'mark' = :mark"),
            {"consumer": run.consumer, "mark": mark},
        ).scalar_one_or_none()


# Gates: a trigger makes the insert of a given mark into a table wait for an advisory lock the
# test holds (advisory locks are scoped to a database: the keys are the test database's own).
_GATE_DDL = (
    """
    CREATE TABLE IF NOT EXISTS test_gate (
        lock_key bigint GENERATED ALWAYS AS IDENTITY (START WITH 73001) PRIMARY KEY,
        table_name text NOT NULL,
        mark text NOT NULL
    )
    """,
    """
    CREATE OR REPLACE FUNCTION test_gate_wait() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        doc jsonb := to_jsonb(NEW);
        gate_key bigint;
    BEGIN
        SELECT lock_key INTO gate_key FROM test_gate
        WHERE table_name = TG_TABLE_NAME
          AND mark = COALESCE(doc->>'mark', doc->'payload'->>'mark');
        IF gate_key IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock_shared(gate_key);
        END IF;
        RETURN NEW;
    END $$
    """,
    "CREATE OR REPLACE TRIGGER test_gate_wait BEFORE INSERT ON test_effects"
    " FOR EACH ROW EXECUTE FUNCTION test_gate_wait()",
    "CREATE OR REPLACE TRIGGER test_gate_wait BEFORE INSERT ON inbox"
    " FOR EACH ROW EXECUTE FUNCTION test_gate_wait()",
)


@contextmanager
def _gate(bed: Bed, table: str, mark: str) -> Iterator[Callable[[], None]]:
    """Hold back the insert of ``mark`` into ``table`` until the gate is opened (the callable
    yielded; the block's end opens it too). On ``test_effects`` the handler has run and waits
    inside its transaction; on ``inbox`` the source waits to ingest the message, unacked.
    Deterministic where a sleep in the handler would race with a loaded machine."""
    with bed.engine.begin() as conn:
        for statement in _GATE_DDL:
            conn.execute(text(statement))
        key = conn.execute(
            text("INSERT INTO test_gate (table_name, mark) VALUES (:t, :m) RETURNING lock_key"),
            {"t": table, "m": mark},
        ).scalar_one()
    holder = bed.engine.connect()
    holder.execute(select(func.pg_advisory_lock(key)))  # a session lock: outlives commits
    holder.commit()
    held = True

    def open_gate() -> None:
        nonlocal held
        if held:
            holder.execute(select(func.pg_advisory_unlock(key)))
            holder.commit()
            held = False

    try:
        yield open_gate
    finally:
        open_gate()
        holder.close()
