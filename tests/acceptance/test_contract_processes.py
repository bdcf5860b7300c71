"""The message contract with worker processes on PostgreSQL, MariaDB and SQLite (the database
source): what the databases recorded, never timings.

- two workers, many pairs of messages sharing an effect key (different event ids), all
  claimable at once -> one effect per key;
- one sequence key's changes stored out of order and numbered by the producer, run by two
  workers at once -> applied in number order, each once.
"""

from __future__ import annotations

import uuid

from sqlalchemy import func, select

from outbox import Message, inbox_table, states, store_many
from outbox.schema import inbox_sequences_table
from tests.support.workers import Bed, wait_all


def _job(mark: str, **contract: object) -> Message:
    return Message(queue="jobs", type="job", payload={"mark": mark}, **contract)  # type: ignore[arg-type]


def _states(bed: Bed) -> dict[str, int]:
    t = inbox_table.c
    with bed.engine.connect() as conn:
        return dict(conn.execute(select(t.state, func.count()).group_by(t.state)).all())  # type: ignore[arg-type]


def test_two_workers_apply_each_effect_key_once(bed: Bed) -> None:
    with bed.engine.begin() as conn:
        store_many(
            conn,
            [_job(f"{n}-{copy}", effect_key=f"e{n}") for n in range(40) for copy in "ab"],
        )
    workers = [bed.spawn(concurrency=2), bed.spawn(concurrency=2)]
    assert wait_all(workers, 120) == [0, 0]

    marks = [e.mark for e in bed.effects()]
    assert sorted(m.split("-")[0] for m in marks) == sorted(str(n) for n in range(40))
    assert _states(bed) == {states.DONE: 80}
    t = inbox_table.c
    with bed.engine.connect() as conn:
        duplicates = conn.execute(
            select(func.count()).where(t.reason == "duplicate-effect")
        ).scalar_one()
    assert duplicates == 40


def test_two_workers_apply_one_keys_changes_in_number_order(bed: Bed) -> None:
    key = f"invoice-{uuid.uuid4().hex[:6]}"
    with bed.engine.begin() as conn:
        # Explicit numbers stored in reverse: the outbox (and the claim) order is 30 .. 1
        store_many(conn, [_job(f"x{n}", sequence_key=key, sequence=n) for n in range(30, 0, -1)])
    workers = [bed.spawn(concurrency=2), bed.spawn(concurrency=2)]
    assert wait_all(workers, 120) == [0, 0]

    assert [e.mark for e in bed.effects()] == [f"x{n}" for n in range(1, 31)]
    assert _states(bed) == {states.DONE: 30}
    s = inbox_sequences_table.c
    with bed.engine.connect() as conn:
        assert conn.execute(select(s.last).where(s.sequence_key == key)).scalar_one() == 30
