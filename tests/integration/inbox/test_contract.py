"""The message contract on the consumer side, on PostgreSQL, MariaDB and SQLite, through the
worker's engine (batched claims and runner), with messages received as a broker delivers
them: effect keys, sequence keys and numbers, schema versions, error classes, EffectUnknown.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, select

from inbox import EffectUnknown
from inbox.settings import ISOLATIONS
from outbox import metrics, states
from outbox.schema import effects_table
from tests.integration.inbox.contract_kit import ContractKit, change, make_contract_kit

pytestmark = pytest.mark.db


def _duplicates(kit: ContractKit, key: str) -> float:
    value = kit.runner.metrics.registry.get_sample_value(
        "inbox_duplicates_total",
        {"consumer": kit.consumer.name, "queue": "jobs", "priority": "1", "key": key},
    )
    return value or 0.0


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_one_effect_key_under_two_event_ids_runs_once(engine: Engine, isolation: str) -> None:
    kit = make_contract_kit(engine, isolation=isolation)
    kit.runner.metrics = metrics.Metrics(CollectorRegistry())
    # Two messages (different event ids) for one effect, in one batch
    kit.receive(change("first", effect_key="invoice-417:reminder"))
    kit.receive(change("second", effect_key="invoice-417:reminder"))

    outcomes = kit.run_pass()

    assert outcomes == {"first": "done", "second": "duplicate"}
    assert kit.applied == ["first"]
    second = kit.row("second")
    assert second.state == states.DONE and second.reason == "duplicate-effect"
    assert second.attempts == 0  # never ran
    with engine.connect() as conn:
        owner = conn.execute(select(effects_table.c.event_id)).scalar_one()
    assert owner == kit.row("first").event_id
    assert _duplicates(kit, metrics.DUPLICATE_BY_EFFECT_KEY) == 1


def test_a_failed_run_does_not_take_the_effect_key(engine: Engine) -> None:
    kit = make_contract_kit(engine)
    kit.raise_for["first"] = RuntimeError("provider down")
    kit.receive(change("first", effect_key="k"))
    assert kit.run_pass() == {"first": states.RETRY}
    kit.receive(change("second", effect_key="k"))
    kit.clock.advance(2)
    outcomes = kit.drain()
    # The retry of the first ran the effect; the second found it taken
    assert outcomes == ["first"]
    assert kit.row("second").reason == "duplicate-effect"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_handler_failing_in_a_batch_gives_its_effect_key_to_the_next_message(
    engine: Engine, isolation: str
) -> None:
    # The batch takes its effect keys in one statement before any handler runs: the key of
    # a handler that fails must be free again for the next message of that key, as when
    # each message took its key just before its handler.
    kit = make_contract_kit(engine, isolation=isolation)
    kit.raise_for["first"] = RuntimeError("provider down")
    kit.receive(change("first", effect_key="k"), change("other", effect_key="k-2"))
    kit.receive(change("second", effect_key="k"))

    assert kit.run_pass() == {"first": states.RETRY, "other": "done", "second": "done"}

    kit.clock.advance(2)
    assert kit.run_pass() == {"first": "duplicate"}
    assert kit.applied == ["other", "second"]
    with engine.connect() as conn:
        owners = dict(
            conn.execute(select(effects_table.c.effect_key, effects_table.c.event_id)).all()
        )
    assert owners == {"k": kit.row("second").event_id, "k-2": kit.row("other").event_id}


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("cut", [False, True], ids=["whole", "time-bound"])
def test_an_effect_key_shared_with_a_sequenced_change_goes_to_the_first_in_line(
    engine: Engine, isolation: str, cut: bool
) -> None:
    # The sequenced change is first in line and takes the key; the plain message after it
    # is the duplicate, whatever the second one's handler or the time bound does.
    kit = make_contract_kit(engine, isolation=isolation)
    if cut:
        kit.runner.batch_seconds = 0.0
    kit.raise_for["plain"] = RuntimeError("must not run")
    kit.receive(change("sequenced", sequence_key="s", sequence=1, effect_key="k"))
    kit.receive(change("plain", effect_key="k"))

    assert kit.run_pass() == {"sequenced": "done", "plain": "duplicate"}

    assert kit.applied == ["sequenced"]
    assert kit.last_applied("s") == 1
    with engine.connect() as conn:
        owner = conn.execute(select(effects_table.c.event_id)).scalar_one()
    assert owner == kit.row("sequenced").event_id


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_batch_cut_by_its_time_bound_leaves_the_rest_their_effect_keys(
    engine: Engine, isolation: str
) -> None:
    # Each message after the first runs in a transaction of its own (time bound 0): the
    # keys taken for the whole batch at its start must not commit with the first one.
    kit = make_contract_kit(engine, isolation=isolation)
    kit.runner.batch_seconds = 0.0
    kit.receive(*(change(m, effect_key=f"key-{m}") for m in ("a", "b", "c")))

    assert kit.run_pass() == {"a": "done", "b": "done", "c": "done"}

    assert kit.applied == ["a", "b", "c"]
    with engine.connect() as conn:
        owners = dict(
            conn.execute(select(effects_table.c.effect_key, effects_table.c.event_id)).all()
        )
    assert owners == {f"key-{m}": kit.row(m).event_id for m in ("a", "b", "c")}


def test_numbers_arriving_1_3_2_are_applied_1_2_3(engine: Engine) -> None:
    kit = make_contract_kit(engine)
    kit.receive(change("n1", sequence_key="invoice-417", sequence=1))
    assert kit.run_pass() == {"n1": "done"}
    kit.receive(change("n3", sequence_key="invoice-417", sequence=3))
    assert kit.run_pass() == {"n3": states.DEFERRED}
    deferred = kit.row("n3")
    assert deferred.state == states.DEFERRED and deferred.reason == "sequence-gap"
    assert deferred.attempts == 0 and kit.last_applied("invoice-417") == 1

    kit.receive(change("n2", sequence_key="invoice-417", sequence=2))
    kit.drain()

    assert kit.applied == ["n1", "n2", "n3"]
    assert kit.last_applied("invoice-417") == 3
    assert kit.row("n3").state == states.DONE


def test_a_successor_deferred_in_the_same_batch_as_its_predecessor_runs_next(
    engine: Engine,
) -> None:
    kit = make_contract_kit(engine)
    # Received 2 before 1: one batch claims both, in receive order
    kit.receive(change("n2", sequence_key="k", sequence=2))
    kit.receive(change("n1", sequence_key="k", sequence=1))
    kit.drain()
    assert kit.applied == ["n1", "n2"]


def test_a_gap_past_its_timeout_goes_to_review(engine: Engine) -> None:
    kit = make_contract_kit(engine, sequence_gap_timeout=30)
    kit.receive(change("n1", sequence_key="k", sequence=1))
    kit.receive(change("n3", sequence_key="k", sequence=3))
    kit.drain()
    assert kit.row("n3").state == states.DEFERRED

    kit.clock.advance(31)
    assert kit.run_pass() == {"n3": states.REVIEW}

    row = kit.row("n3")
    assert row.state == states.REVIEW and row.reason == "sequence-gap"
    assert "waits for change 2" in row.last_error and row.next_check
    assert kit.applied == ["n1"] and kit.last_applied("k") == 1


def test_a_gap_whose_predecessor_is_held_keeps_waiting(engine: Engine) -> None:
    kit = make_contract_kit(engine, sequence_gap_timeout=30)
    kit.raise_for["n1"] = EffectUnknown("provider timed out", check="look up payment 417")
    kit.receive(change("n1", sequence_key="k", sequence=1))
    kit.receive(change("n2", sequence_key="k", sequence=2))
    kit.drain()
    kit.clock.advance(31)
    kit.drain()
    # n1 is in the inbox (unknown): n2 is not lost, it waits for n1's resolution
    assert kit.row("n1").state == states.UNKNOWN
    assert kit.row("n2").state == states.DEFERRED
    assert kit.applied == []


def test_a_number_applied_already_is_stale_and_changes_nothing(engine: Engine) -> None:
    kit = make_contract_kit(engine)
    kit.receive(change("n1", sequence_key="k", sequence=1))
    kit.receive(change("n2", sequence_key="k", sequence=2))
    kit.drain()
    kit.receive(change("n1-again", sequence_key="k", sequence=1))

    assert kit.run_pass() == {"n1-again": states.STALE}

    row = kit.row("n1-again")
    assert row.state == states.STALE and row.reason == "stale" and row.finished_at
    assert "last applied change is 2" in row.last_error
    assert kit.applied == ["n1", "n2"] and kit.last_applied("k") == 2


def test_an_unsupported_schema_version_goes_to_review_without_running(engine: Engine) -> None:
    kit = make_contract_kit(engine, versions=["2021-03"])
    kit.receive(change("new", schema_version="2024-01"))
    kit.receive(change("none"))
    kit.receive(change("ok", schema_version="2021-03"))

    outcomes = kit.run_pass()

    assert outcomes == {"new": states.REVIEW, "none": states.REVIEW, "ok": "done"}
    assert kit.applied == ["ok"]
    for mark in ("new", "none"):
        row = kit.row(mark)
        assert row.reason == "unsupported-schema" and row.attempts == 0
        assert "accepts versions ['2021-03']" in row.last_error
    # Never retried: nothing is claimable later
    kit.clock.advance(3600)
    assert kit.run_pass() == {}


class Temporary(Exception):
    pass


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_with_transient_errors_only_those_retry(engine: Engine, isolation: str) -> None:
    kit = make_contract_kit(engine, isolation=isolation, transient_errors=[Temporary])
    kit.raise_for.update(t=Temporary("try later"), v=ValueError("bad amount"))
    kit.receive(change("t"), change("v"))

    outcomes = kit.run_pass()

    assert outcomes == {"t": states.RETRY, "v": states.REVIEW}
    row = kit.row("v")
    assert row.reason == "not-transient" and row.attempts == 1
    assert "ValueError: bad amount" in row.last_error and row.next_check


def test_per_queue_transient_errors_override_the_consumers(engine: Engine) -> None:
    kit = make_contract_kit(
        engine,
        transient_errors=[Temporary],
        queue_policies={"jobs": {"transient_errors": [ValueError]}},
    )
    kit.raise_for.update(v=ValueError("flaky"), t=Temporary("x"))
    kit.receive(change("v"), change("t"))
    assert kit.run_pass() == {"v": states.RETRY, "t": states.REVIEW}


def test_effect_unknown_holds_the_group_and_the_sequence(engine: Engine) -> None:
    kit = make_contract_kit(engine)
    kit.raise_for["pay"] = EffectUnknown("provider timed out", check="look up payment 417")
    kit.receive(change("pay", serial_group="order-1", sequence_key="order-1", sequence=1))
    assert kit.run_pass() == {"pay": states.UNKNOWN}
    kit.receive(change("ship", serial_group="order-1", sequence_key="order-1", sequence=2))
    kit.receive(change("other", serial_group="order-2"))

    kit.clock.advance(3600)
    kit.drain()

    row = kit.row("pay")
    assert row.state == states.UNKNOWN and row.reason == "effect-unknown"
    assert row.next_check == "look up payment 417" and "provider timed out" in row.last_error
    assert row.attempts == 1
    # The group and the key are held: ship does not run over an unknown state; others do
    assert kit.applied == ["other"]
    assert kit.row("ship").state in (states.WAITING, states.READY, states.DEFERRED)
    assert kit.last_applied("order-1") == 0


def test_effect_unknown_needs_a_check() -> None:
    with pytest.raises(ValueError, match="check"):
        EffectUnknown("lost answer", check=" ")
