"""A read from positions (``inbox.positions``) walks past the index entries that rows done
behind a held snapshot leave, where a read from the head of the range walks every one.

The setting: a transaction holds a snapshot (a long report) while most of a backlog is taken,
so vacuum can remove none of the entries the taken rows left in the state index. PostgreSQL's
``auto_explain`` reports the buffers each read touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from inbox.sql import claims as q
from inbox.sql.ingest import pending_outbox, pending_parameters
from inbox.sql.predicates import point_shape, point_values
from outbox.dialect import dialect_of
from outbox.dsn import make_engine
from outbox.schema import inbox_table, outbox_table
from tests.support.databases import DatabaseFactory

ROWS = 20_000
TAKEN = 19_900  # taken behind the snapshot: their entries stay in the state index
LIMIT = 10


@pytest.fixture
def taken_behind_a_snapshot(db_factories: dict[str, DatabaseFactory]) -> Iterator[Engine]:
    """``ROWS`` ready inbox rows and pending outbox rows (priority 1, seq = id), of which the
    first ``TAKEN`` were taken (done, sent) while another transaction held its snapshot;
    vacuumed, which can remove none of their old versions."""
    with db_factories["postgresql"].database() as url:
        engine = make_engine(url)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO inbox (event_id, consumer, queue, priority, seq, type, headers,"
                    " state, available_at, received_at) SELECT gen_random_uuid(), 'c', 'q', 1,"
                    " g, 't', '{}', 'ready', now(), now() FROM generate_series(1, :rows) g"
                ),
                {"rows": ROWS},
            )
            conn.execute(
                text(
                    "INSERT INTO outbox (event_id, queue, priority, type, payload, headers,"
                    " occurred_at, available_at, status) SELECT gen_random_uuid(), 'q', 1, 't',"
                    " '{}', '{}', now(), now(), 'pending' FROM generate_series(1, :rows) g"
                ),
                {"rows": ROWS},
            )
        report = engine.connect()
        report.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.exec_driver_sql("SELECT count(*) FROM inbox").scalar()
        with engine.begin() as conn:
            conn.execute(text("UPDATE inbox SET state = 'done' WHERE seq <= :n"), {"n": TAKEN})
            conn.execute(text("UPDATE outbox SET status = 'sent' WHERE id <= :n"), {"n": TAKEN})
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("VACUUM ANALYZE inbox")
            conn.exec_driver_sql("VACUUM ANALYZE outbox")
        try:
            yield engine
        finally:
            report.rollback()
            report.close()
            engine.dispose()


def later() -> datetime:
    """A moment after every row's ``available_at`` (taken when the test runs, not when the
    module was collected: a long parallel run may start it minutes later)."""
    return datetime.now(UTC) + timedelta(minutes=1)


def buffers_of(conn: Connection, statement: Any, parameters: dict[str, Any]) -> int:
    """Shared buffers (hit + read) that one run of ``statement`` touched, rolled back."""
    notices: list[str] = []
    conn.connection.driver_connection.add_notice_handler(  # type: ignore[union-attr]
        lambda diagnostic: notices.append(diagnostic.message_primary or "")
    )
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_analyze = on",
        "SET auto_explain.log_buffers = on",
        "SET auto_explain.log_level = 'notice'",
    ):
        conn.exec_driver_sql(setting)
    conn.commit()
    notices.clear()
    rows = conn.execute(statement, parameters).all()
    conn.rollback()
    assert rows, "the read found none of the rows left"
    plans = [n for n in notices if "plan:" in n]
    assert len(plans) == 1, notices
    # The plan's first line is its top node: its buffers include every node below.
    top = re.search(r"Buffers: shared ((?:hit|read)=\d+(?: (?:hit|read)=\d+)?)", plans[0])
    assert top is not None, plans[0]
    return sum(int(n) for n in re.findall(r"=(\d+)", top.group(1)))


def test_a_claim_from_its_position_skips_the_entries_of_taken_rows(
    taken_behind_a_snapshot: Engine,
) -> None:
    dialect = dialect_of(taken_behind_a_snapshot)
    parameters = {"consumer": "c", "now": later(), "limit": LIMIT}
    from_head = q.locked_candidates(inbox_table, dialect, False)
    from_position = q.locked_candidates(inbox_table, dialect, False, (True,))
    with taken_behind_a_snapshot.connect() as conn:
        head = buffers_of(conn, from_head, parameters)
        positioned = buffers_of(conn, from_position, parameters | point_values([(1, TAKEN)]))
    # From the head: an entry per taken row (a hundred index pages and the heap pages they
    # point to); from the position: the rows read and locked, and a descent per branch.
    assert head > TAKEN / 100, head
    assert positioned < 50, positioned


def test_a_take_from_its_position_skips_the_entries_of_sent_rows(
    taken_behind_a_snapshot: Engine,
) -> None:
    dialect = dialect_of(taken_behind_a_snapshot)
    now = later()
    with taken_behind_a_snapshot.connect() as conn:
        head = buffers_of(
            conn, pending_outbox(outbox_table, dialect), pending_parameters(["q"], now, LIMIT)
        )
        points = [(1, TAKEN)]
        statement = pending_outbox(outbox_table, dialect, point_shape(points))
        positioned = buffers_of(conn, statement, pending_parameters(["q"], now, LIMIT, points))
    assert head > TAKEN / 100, head
    assert positioned < 50, positioned
