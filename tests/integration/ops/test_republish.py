"""``outbox republish``: sent rows a broker lost go back to pending and through the relay again.

The CLI on every database (selection by id or by sent window, --dry-run, --json, the audit
record, exit codes); and, end to end on PostgreSQL with RabbitMQ, the case it exists for: a
purged queue loses a confirmed message, the later message of its serial group waits for it (G5
in a job-queue deployment), the operator republishes the lost one, and the group runs in order,
each message once.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
import pytest
from sqlalchemy import Engine, create_engine, select, text, update

from outbox import Message, states, store_many
from outbox.ops import admin
from relay.publishers import publisher_from_url
from relay.relay import Relay, RelaySettings
from tests.integration.ops.rows import SCHEMA, outbox_row
from tests.integration.ops.test_cli import run
from tests.integration.relay.publishers_fixtures import unique
from tests.support import services
from tests.support.workers import Bed, completed_order, wait_for


@pytest.fixture
def sent_rows(engine: Engine) -> dict[str, int]:
    # Times taken now, not at import: the CLI's "1h" is measured from its own clock.
    now = datetime.now(UTC)
    old = now - timedelta(days=2)
    with engine.begin() as conn:
        return {
            "old": outbox_row(conn, status=states.SENT, occurred_at=old, sent_at=old, attempts=1),
            "recent": outbox_row(
                conn, status=states.SENT, occurred_at=now, sent_at=now, attempts=2
            ),
            "recent_sms": outbox_row(
                conn, status=states.SENT, occurred_at=now, sent_at=now, type_="sms"
            ),
            "other_queue": outbox_row(
                conn, status=states.SENT, occurred_at=now, sent_at=now, queue="billing"
            ),
            "pending": outbox_row(conn, occurred_at=now),
            "failed": outbox_row(conn, status=states.FAILED, occurred_at=now, attempts=5),
        }


def _status(engine: Engine) -> dict[int, tuple[str, int, datetime | None]]:
    t = SCHEMA.outbox.c
    with engine.connect() as conn:
        rows = conn.execute(select(t.id, t.status, t.attempts, t.sent_at)).all()
    return {int(r.id): (r.status, r.attempts, r.sent_at) for r in rows}


def test_republish_by_window_and_by_id(dsn: str, engine: Engine, sent_rows: dict[str, int]) -> None:
    before = _status(engine)
    dry = run(
        dsn, "republish", "--sent-since", "1h", "--queue", "mail", "--dry-run", "--json",
        "--reason", "look",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    answer = json.loads(dry.stdout)
    assert answer["ids"] == [sent_rows["recent"], sent_rows["recent_sms"]]
    # the resolved window is said, its end "now" by default
    since, until = (datetime.fromisoformat(answer[k]) for k in ("sent_since", "sent_until"))
    assert timedelta(minutes=59) < until - since < timedelta(minutes=61)
    assert _status(engine) == before  # a dry run changes nothing ...
    with engine.connect() as conn:
        assert conn.execute(select(SCHEMA.audit)).first() is None  # ... and audits nothing

    out = run(
        dsn, "republish", "--sent-since", "1h", "--queue", "mail", "--type", "send",
        "--reason", "queue purged", OUTBOX_ACTOR="oncall-ann", OUTBOX_SENT_UNTIL="",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("window: sent from ")
    assert f"republished 1 row(s): {sent_rows['recent']}" in out.stdout
    after = _status(engine)
    assert after[sent_rows["recent"]] == (states.PENDING, 0, None)
    for untouched in ("old", "recent_sms", "other_queue", "pending", "failed"):
        assert after[sent_rows[untouched]] == before[sent_rows[untouched]], untouched
    with engine.connect() as conn:
        audit = conn.execute(select(SCHEMA.audit)).one()._mapping
    assert (audit["action"], audit["actor"], audit["reason"], audit["row_ids"]) == (
        "republish", "oncall-ann", "queue purged", [sent_rows["recent"]],
    )  # fmt: skip

    # By id: the old one goes; a pending and a failed row are not "sent": exit 1, named
    by_id = run(
        dsn, "republish", "--json", "--reason", "r", "--id", str(sent_rows["old"]),
        "--id", str(sent_rows["pending"]), "--id", str(sent_rows["failed"]),
    )  # fmt: skip
    assert by_id.returncode == 1
    answer = json.loads(by_id.stdout)
    assert answer["ids"] == [sent_rows["old"]]
    assert answer["not_sent"] == sorted([sent_rows["pending"], sent_rows["failed"]])
    assert str(sent_rows["pending"]) in by_id.stderr
    assert _status(engine)[sent_rows["old"]] == (states.PENDING, 0, None)


def test_republish_window_end_and_usage_errors(
    dsn: str, engine: Engine, sent_rows: dict[str, int]
) -> None:
    until = run(
        dsn, "republish", "--sent-since", "7d", "--sent-until", "1d", "--dry-run", "--json",
        "--reason", "r",
    )  # fmt: skip
    assert until.returncode == 0, until.stderr
    assert json.loads(until.stdout)["ids"] == [sent_rows["old"]]
    with pytest.raises(ValueError, match="sent_since"):  # the function refuses "everything"
        admin.republish(engine, SCHEMA, now=datetime.now(UTC), reason="r", actor="a")

    for args, named in (
        (["--reason", "r"], "--sent-since"),  # neither --id nor a window
        (["--id", "1", "--sent-since", "1h", "--reason", "r"], "--sent-since"),  # both
        (["--sent-until", "1h", "--id", "1", "--reason", "r"], "--sent-until"),
        (["--sent-since", "yesterday", "--reason", "r"], "--sent-since"),
        (["--sent-since", "1h", "--reason", "  "], "--reason"),
        (["--sent-since", "1h", "--sent-until", "2h", "--reason", "r"], "--sent-until"),
        (["--sent-since", "", "--reason", "r"], "--sent-since"),  # empty = not given
    ):
        out = run(dsn, "republish", *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert named in out.stderr, (args, out.stderr)


@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_producers_and_the_relay_go_on_while_a_republish_is_open(
    engine: Engine, sent_rows: dict[str, int]
) -> None:
    """A window republish reads with FOR UPDATE. Under InnoDB's REPEATABLE READ that locks
    every gap it scans, i.e. where producers insert pending rows and where the relay marks
    rows sent: both would wait for the operator's transaction. The progress callback runs
    inside that transaction: a store() and a relay-like mark-sent must commit from there."""
    other = create_engine(engine.url)
    done: list[str] = []

    def meanwhile(_n: int) -> None:
        with other.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SET LOCAL lock_timeout = '3s'"))
            else:
                conn.execute(text("SET SESSION innodb_lock_wait_timeout = 3"))
            # the most urgent-last pending row: its index entry sits next to the sent range
            store_many(conn, [Message("mail", "send", {"n": 9}, priority=9)])
            conn.execute(
                update(SCHEMA.outbox)
                .where(SCHEMA.outbox.c.id == sent_rows["pending"])
                .values(status=states.SENT, sent_at=datetime.now(UTC))
            )
        done.append("committed")

    try:
        result = admin.republish(
            engine, SCHEMA, now=datetime.now(UTC), reason="r", actor="a",
            sent_since=datetime.now(UTC) - timedelta(hours=1), progress=meanwhile,
        )  # fmt: skip
    finally:
        other.dispose()
    assert done == ["committed"]
    assert result.ids == [sent_rows["recent"], sent_rows["recent_sms"], sent_rows["other_queue"]]


# --- end to end: the broker lost a confirmed message ------------------------------------------


@pytest.fixture
def bed(dsn: str, engine: Engine, tmp_path: Path) -> Iterator[Bed]:
    testbed = Bed.create(dsn, engine, tmp_path)
    yield testbed
    testbed.dispose()


def _relay_once(bed: Bed, queue: str) -> int:
    relay = Relay(
        bed.engine,
        publisher_from_url(services.RABBITMQ_URL, confirm_timeout=10),
        RelaySettings(queues=(queue,), stop_when_idle=True, poll_interval=0.05),
    )
    return relay.run().sent


def _broker(action: str, name: str) -> None:
    with contextlib.closing(
        pika.BlockingConnection(pika.URLParameters(services.RABBITMQ_URL))
    ) as c:
        channel = c.channel()
        if action == "purge":
            channel.queue_purge(name)
        else:
            channel.queue_delete(name)


def _mark(payload: object) -> object:
    document = json.loads(payload) if isinstance(payload, str) else payload
    return document.get("mark") if isinstance(document, dict) else None


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_a_lost_message_republished_lets_its_group_go_on_in_order(bed: Bed) -> None:
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")
    queue, consumer, group = unique("republish-"), unique("consumer-"), "order-17"
    inbox, outbox = SCHEMA.inbox.c, SCHEMA.outbox.c
    try:
        # Given "first" published and confirmed, then lost by the broker (queue purged) ...
        with bed.engine.begin() as conn:
            (first,) = store_many(
                conn, [Message(queue, "job", {"mark": "first"}, serial_group=group)]
            )
        assert _relay_once(bed, queue) == 1
        _broker("purge", f"{queue}_1")
        # ... and "second" of the same group published after it
        with bed.engine.begin() as conn:
            store_many(conn, [Message(queue, "job", {"mark": "second"}, serial_group=group)])
        assert _relay_once(bed, queue) == 1
        worker = bed.spawn(
            stop_when_idle=False, time_limit=120, extra=["--source", services.RABBITMQ_URL],
            queues=[queue], consumer=consumer,
        )  # fmt: skip

        def state_of(mark: str) -> str | None:
            with bed.engine.connect() as conn:
                rows = conn.execute(
                    select(inbox.state, inbox.payload).where(inbox.consumer == consumer)
                ).all()
            found = [r.state for r in rows if _mark(r.payload) == mark]
            assert len(found) <= 1, found  # one inbox row per (event, consumer)
            return found[0] if found else None

        # When the worker has received "second": it waits for "first" (sent, not received)
        wait_for(lambda: state_of("second") == states.WAITING, 60, "second to wait for first")
        assert state_of("first") is None and bed.effects() == []

        # ... and the operator republishes the lost message, and the relay sends it again
        with bed.engine.connect() as conn:
            first_id = conn.execute(select(outbox.id).where(outbox.event_id == first)).scalar()
        out = run(bed.dsn, "republish", "--id", str(first_id), "--reason", "queue purged")
        assert out.returncode == 0, out.stderr
        assert _relay_once(bed, queue) == 1

        # Then the group runs in its order, each message once
        wait_for(lambda: state_of("second") == states.DONE, 60, "the group to finish")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        for priority in range(1, 10):
            _broker("delete", f"{queue}_{priority}")
    assert [e.mark for e in bed.effects()] == ["first", "second"]
    assert completed_order(bed.events(), group) == ["first", "second"]
    assert state_of("first") == states.DONE
