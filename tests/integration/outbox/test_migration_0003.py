"""Revision 0003 on a database created by 0002, with messages in flight at upgrade time:
``inbox_groups`` is built from the rows in line or running (every such group marked, for
its consumer only), and a worker of the new version then finishes every message, each group
in its order. The group ``gw`` holds only waiting rows with nothing running: no claim will
look at it; the head pass finds it through the mark the migration set (or the full pass a
worker runs at start)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import ANY
from uuid import uuid4

from alembic import command
from sqlalchemy import Engine, insert, select
from sqlalchemy.engine import URL

from outbox import states
from outbox.config import DEFAULT_CONFIG
from outbox.dsn import make_engine
from outbox.migrate import _alembic_config
from outbox.schema import groups_table, inbox_table
from tests.integration.bad_input.app import effects
from tests.integration.bad_input.support import create_effects, run_worker, worker_env
from tests.integration.relay.publishers_fixtures import unique
from tests.support.databases import DatabaseFactory

PAST = datetime.now(UTC) - timedelta(minutes=5)
# (mark, group, priority, seq, state): per group, the order is (priority, seq).
IN_FLIGHT = [
    ("w1", "gw", 1, 1, states.WAITING),
    ("w2", "gw", 1, 2, states.WAITING),
    ("a2", "ga", 2, 3, states.READY),
    ("a1", "ga", 1, 4, states.WAITING),
    ("a3", "ga", 2, 5, states.WAITING),
    ("p1", "gp", 1, 6, states.PROCESSING),  # its worker died: the lease ran out
    ("p2", "gp", 1, 7, states.WAITING),
    ("r1", "gr", 1, 8, states.RETRY),  # due again
    ("r2", "gr", 1, 9, states.WAITING),
    ("u1", None, 1, 10, states.READY),
    ("d1", "gd", 1, 11, states.DONE),
]
ORDER: dict[str | None, list[str]] = {
    "gw": ["w1", "w2"],
    "ga": ["a1", "a2", "a3"],
    "gp": ["p1", "p2"],
    "gr": ["r1", "r2"],
}


def _row(consumer: str, mark: str, group: str | None, priority: int, seq: int, state: str) -> Any:
    row: dict[str, Any] = {
        "event_id": uuid4(),
        "consumer": consumer,
        "queue": "jobs",
        "priority": priority,
        "serial_group": group,
        "seq": seq,
        "type": "job",
        "payload": json.dumps({"mark": mark}),
        "headers": "{}",
        "state": state,
        "attempts": 0,
        "available_at": PAST,
        "received_at": PAST,
        "finished_at": PAST if state == states.DONE else None,
        # Every key in every row: an executemany takes its columns from the first row.
        "claim_token": None,
        "claimed_at": None,
        "lease_until": None,
        "last_error": None,
    }
    if state == states.PROCESSING:
        row.update(attempts=1, claim_token=uuid4(), claimed_at=PAST, lease_until=PAST)
    if state == states.RETRY:
        row.update(attempts=1, last_error="RuntimeError: before the upgrade")
    return row


@contextmanager
def _at_0002_in_flight(db_factory: DatabaseFactory, consumer: str) -> Iterator[tuple[Engine, URL]]:
    """A database migrated to 0002 holding ``IN_FLIGHT`` for ``consumer``, and a group another
    consumer has in line; the engine is disposed at the end."""
    with db_factory.database(empty=True) as url:
        engine = make_engine(url)
        try:
            _upgrade(engine, "0002")
            with engine.begin() as conn:
                conn.execute(insert(inbox_table), [_row(consumer, *r) for r in IN_FLIGHT])
                conn.execute(insert(inbox_table), [_row("other", "o1", "gw", 1, 12, "waiting")])
            yield engine, url
        finally:
            engine.dispose()


def _upgrade(engine: Engine, revision: str) -> None:
    config = _alembic_config(DEFAULT_CONFIG)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def test_upgrade_from_0002_with_messages_in_flight(db_factory: DatabaseFactory) -> None:
    consumer = unique("m3-")
    with _at_0002_in_flight(db_factory, consumer) as (engine, url):
        _upgrade(engine, "head")
        with engine.connect() as conn:
            marked = {tuple(r) for r in conn.execute(select(groups_table))}
        # The other consumer's group is marked for that consumer only.
        assert marked == {
            *((consumer, g, True) for g in ("gw", "ga", "gp", "gr")),
            ("other", "gw", True),
        }
        create_effects(engine)
        dsn = url.render_as_string(hide_password=False)
        proc = run_worker(dsn, "", worker_env(consumer, ["jobs"], ["job"]))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with engine.connect() as conn:
            ran = conn.execute(select(effects.c.mark, effects.c.grp).order_by(effects.c.id))
            by_group: dict[str | None, list[str]] = {}
            for mark, group in ran:
                by_group.setdefault(group, []).append(mark)
        expected: dict[str | None, list[str]] = {**ORDER, None: ["u1"]}
        assert by_group == expected, proc.stderr[-3000:]
        assert _states(engine, consumer) == {r[0]: (states.DONE, ANY) for r in IN_FLIGHT}


def test_a_worker_refuses_a_database_not_yet_at_0003(db_factory: DatabaseFactory) -> None:
    # Given a database at 0002 with messages in flight, and a worker of this version
    consumer = unique("m2-")
    with _at_0002_in_flight(db_factory, consumer) as (engine, url):
        create_effects(engine)
        before = _states(engine, consumer)

        # When it starts
        proc = run_worker(
            url.render_as_string(hide_password=False), "", worker_env(consumer, ["jobs"], ["job"])
        )

        # Then it exits 1 naming the missing table and what to run, and has run nothing
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"missing table(s) {groups_table.name}:" in proc.stderr, proc.stderr
        assert "outbox migrate" in proc.stderr and "Traceback" not in proc.stderr
        assert _states(engine, consumer) == before
        with engine.connect() as conn:
            assert conn.execute(select(effects.c.mark)).all() == []


def _states(engine: Engine, consumer: str) -> dict[str, tuple[str, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(inbox_table.c.payload, inbox_table.c.state, inbox_table.c.attempts).where(
                inbox_table.c.consumer == consumer
            )
        ).all()
    return {payload["mark"]: (state, attempts) for payload, state, attempts in rows}
