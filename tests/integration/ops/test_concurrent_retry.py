"""Two operators retrying the same failed rows at once, from two processes: every row is
retried once and named by exactly one audit record."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, func, select, text

from outbox import states
from tests.integration.ops.rows import SCHEMA
from tests.integration.ops.test_cli import OUTBOX

ROWS = 1500


def wait_until_both_blocked(
    engine: Engine, dialect: str, procs: list[subprocess.Popen[str]]
) -> None:
    """Poll the server until two sessions of this database wait for a lock (deadline 60 s).

    SQLite serialises writers at BEGIN IMMEDIATE and cannot say who waits: there the test
    checks the outcome only."""
    if dialect == "postgresql":
        probe = text(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    elif dialect == "mariadb":
        # innodb_trx does not always list a locking read that waits; a statement of this
        # database running for half a second does, on a table this small, mean waiting.
        probe = text(
            "SELECT count(*) FROM information_schema.processlist"
            " WHERE db = DATABASE() AND command = 'Query' AND id <> CONNECTION_ID()"
            " AND time_ms >= 500"
        )
    else:
        return
    deadline = time.monotonic() + 60
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        while time.monotonic() < deadline:
            if conn.execute(probe).scalar_one() >= 2:
                return
            assert all(p.poll() is None for p in procs), "a retry ended before blocking"
            time.sleep(0.05)
    raise AssertionError("the two retries never waited on the held lock")


def test_concurrent_retry_all(engine: Engine, dsn: str, dialect: str) -> None:
    # Given many failed rows (several id chunks, so the two transactions overlap in time)
    old = datetime.now(UTC) - timedelta(days=1)
    with engine.begin() as conn:
        conn.execute(
            SCHEMA.outbox.insert(),
            [
                {
                    "event_id": uuid.uuid4(), "queue": "mail", "priority": 1,
                    "type": "send", "payload": "{}", "headers": "{}", "occurred_at": old,
                    "available_at": old, "status": states.FAILED, "attempts": 5,
                }
                for _ in range(ROWS)
            ],
        )  # fmt: skip

    # When two processes retry --all at the same time: the test holds a lock on one of the
    # rows until both are waiting for it, so their transactions truly overlap.
    env = {**os.environ, "OUTBOX_DSN": dsn}
    with engine.connect() as holder:
        if dialect != "sqlite":
            holder.begin()
        t = SCHEMA.outbox
        if dialect != "sqlite":
            holder.execute(select(t.c.id).order_by(t.c.id.desc()).limit(1).with_for_update())
        procs = [
            subprocess.Popen(
                [OUTBOX, "retry", "--all", "--json", "--reason", "race", "--by", who],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for who in ("alice", "bob")
        ]
        wait_until_both_blocked(engine, dialect, procs)
        holder.rollback()
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out + err

    # Then every row is pending once more, and the audit names each id exactly once
    with engine.connect() as conn:
        t = SCHEMA.outbox
        counts: dict[str, int] = {
            s: n for s, n in conn.execute(select(t.c.status, func.count()).group_by(t.c.status))
        }
        audits = conn.execute(select(SCHEMA.audit.c.actor, SCHEMA.audit.c.row_ids)).all()
        all_ids = set(conn.execute(select(t.c.id)).scalars())
    assert counts == {states.PENDING: ROWS}
    named = [i for _actor, ids in audits for i in ids]
    assert len(named) == ROWS
    assert set(named) == all_ids
