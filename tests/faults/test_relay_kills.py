"""S8 end to end: three relay processes publish while one of them, chosen at
random, is SIGKILLed 20 times at random instants and restarted; three worker processes take
the messages from the broker and run the handler. Asserted from the database: every stored
event done once with one effect, no two runs of a group at once; the broker holds nothing
unconsumed at the end. The duplicate deliveries the inbox absorbed are printed.

Also here: the checks of tests/faults/pipeline.py fed with fabricated bad data, to show that
they can fail."""

from __future__ import annotations

import random
import time
import uuid

import pytest

from outbox import states
from tests.faults.pipeline import MakePipeline, messages, rabbit_leftovers, scaled, wait_until
from tests.faults.verdict import InboxFact, Run, judge, verdict
from tests.support import services

KILLS = 20
WORKERS = 3


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    ("dialect", "broker_url", "total"),
    [
        pytest.param("postgresql", "rabbitmq", 20_000, id="pg-rabbitmq"),
        pytest.param("mariadb", "rabbitmq", 3_000, id="mariadb-rabbitmq"),
        pytest.param("postgresql", "kafka", 3_000, id="pg-kafka"),
        pytest.param("mariadb", "kafka", 2_000, id="mariadb-kafka"),
    ],
    indirect=["dialect", "broker_url"],
)
def test_relays_sigkilled_at_random_instants_lose_nothing(
    dialect: str, broker_url: str, total: int, make_pipeline: MakePipeline
) -> None:
    total = scaled(total)
    # Given three relays and three workers on one database and one broker
    pipe = make_pipeline(broker_url, broker_url)
    chunk = total // KILLS
    # Batches well under a chunk: a chunk is several commits, so a kill can land between them
    # (with one batch per chunk the rows all turned sent in one commit, and no kill was busy).
    for _ in range(3):
        pipe.add_relay("--batch-size", str(max(5, chunk // 6)))
    for _ in range(WORKERS):
        pipe.add_worker()
    pipe.wait_ready()
    rng = random.Random()
    load = messages(pipe.queue, total)

    # When, 20 times, rows arrive and a random running relay is SIGKILLed a random instant
    # later, then restarted (the next victim is chosen among the relays that are up, so the
    # loop never waits for a restart)
    busy_kills = 0  # kills while rows were waiting to be published
    started = time.monotonic()
    for kill in range(KILLS):
        wait_until(lambda: any(r.ready() for r in pipe.relays), 120, "a relay up")
        victim = rng.choice([r for r in pipe.relays if r.ready()])
        # the instant: when a random share of the new rows has been published
        target = pipe.count_sent() + rng.randint(1, chunk - 1)
        pipe.store(load[kill * chunk : (kill + 1) * chunk])
        pipe.wait_sent(target)
        busy_kills += pipe.count_sent() < pipe.stored
        victim.kill()
        victim.start()
    pipe.store(load[KILLS * chunk :])
    finished = pipe.wait_finished(total, timeout=900)
    elapsed = time.monotonic() - started
    relay_codes, worker_codes = pipe.stop()

    # Then nothing is lost, nothing is done twice, no group ever ran two at once
    result = verdict(pipe)
    broker = "rabbitmq" if broker_url.startswith("amqp") else "kafka"
    db = "pg" if dialect == "postgresql" else dialect
    print(
        "\n"
        + result.line(
            f"relay-kill {db} {broker}", kills=KILLS, busy_kills=busy_kills, seconds=int(elapsed)
        )
    )
    assert finished and result.ok, result.detail()
    assert result.done == total
    assert relay_codes == [0, 0, 0] and worker_codes == [0] * WORKERS
    # most kills hit while rows were pending, or the test proves little
    assert busy_kills >= KILLS // 2, busy_kills
    if broker == "rabbitmq":
        # What is still queued at the broker can only be a copy of something done.
        names = [f"{pipe.queue}_{p}" for p in (1, 2)]
        leftovers = rabbit_leftovers(services.RABBITMQ_URL, names)
        assert set(leftovers) <= {str(e) for e in pipe.stored_ids()}


# -- the checks can fail ------------------------------------------------------------------------


def _runs(group: str, *spans: tuple[str, float, float | None]) -> list[Run]:
    out: list[Run] = []
    for mark, start, end in spans:
        out.append(Run(group, mark, "start", 1, 1, start))
        if end is not None:
            out.append(Run(group, mark, "end", 1, 1, end))
    return out


def test_the_checks_catch_lost_double_and_overlapping_runs() -> None:
    # Given fabricated records: a (done, 1 effect), b (done, 2 effects), c (no inbox row),
    # d (done, no effect), e (failed with a reason), f (failed, no reason), g (effect, not done)
    a, b, c, d, e, f, g = (uuid.uuid4() for _ in range(7))
    stranger = uuid.uuid4()  # an effect of no stored event
    inbox = [
        InboxFact(a, states.DONE, None, 0),
        InboxFact(b, states.DONE, None, 2),
        InboxFact(d, states.DONE, None, 0),
        InboxFact(e, states.FAILED, "ValueError: no", 0),
        InboxFact(f, states.FAILED, None, 0),
        InboxFact(g, states.PROCESSING, None, 1),
    ]
    effects = [a, b, b, g, stranger]
    runs = _runs("g1", ("a", 1.0, 2.0), ("b", 1.5, 3.0), ("c", 3.0, 4.0))  # a and b overlap
    runs += _runs("g2", ("d", 1.0, None))  # started, never ended
    runs += [*_runs("", ("x", 1.0, 2.0)), Run(None, "u", "start", 2, 1, 1.2)]

    # When they are judged
    result = judge([a, b, c, d, e, f, g], inbox, {}, effects, runs)

    # Then every fault is found, and the sound parts are not flagged
    assert set(result.lost) == {c, d, f, g}
    assert set(result.double) == {b, g, stranger}
    assert result.overlaps == [("g1", "a", "b")]
    assert result.open_runs == 1
    assert (result.done, result.failed, result.duplicates_absorbed) == (2, 1, 3)
    assert not result.ok
    # a sound record passes, and a failed outbox row with its reason counts as accounted for
    sound = judge([a, c], [inbox[0]], {c: "refused: too large"}, [a], runs[:2])
    assert sound.ok and (sound.done, sound.failed) == (1, 1)
    assert "lost=0 double=0 overlaps=0" in sound.line("x")


def test_two_inbox_rows_of_one_event_are_a_double() -> None:
    a = uuid.uuid4()
    rows = [InboxFact(a, states.DONE, None, 0), InboxFact(a, states.DONE, None, 0)]
    assert judge([a], rows, {}, [a], []).double == [a]
