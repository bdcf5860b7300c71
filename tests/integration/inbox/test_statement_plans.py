"""The statements that name their rows by id read those rows by primary key on PostgreSQL,
however many other rows share the state they check, and whatever the table's statistics say.

The setting that made them grow with the backlog: statistics taken when the table was empty
(a new deployment, or a queue table autovacuum has not analyzed since it filled), then many
rows in one state. Checked plainly, ``id IN (...) AND state = 'processing'`` was then planned
as a read of the state index (every processing, or finished, row) ANDed with the id list.
PostgreSQL's own ``auto_explain`` reports the plan each statement ran with, past psycopg's
prepare threshold (a prepared statement may switch to a generic plan on its sixth run).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from inbox.sql import claims as q
from inbox.sql.finish import finish_failed
from inbox.sql.ingest import mark_outbox_sent
from outbox.dsn import make_engine
from outbox.schema import inbox_table, outbox_table
from relay import queries as relay_queries
from tests.support.databases import DatabaseFactory

ROWS = 20_000
TOKEN = uuid.uuid4()
IDS = list(range(100, 120))
# More runs than psycopg's prepare threshold (5).
RUNS = 7


@pytest.fixture
def stale_statistics(db_factories: dict[str, DatabaseFactory]) -> Iterator[Engine]:
    """An inbox and an outbox analyzed empty, then filled: half the inbox processing under one
    token, half ready; every outbox row pending. Autovacuum is off for the two tables, so
    that no ANALYZE refreshes the statistics while the test runs."""
    with db_factories["postgresql"].database() as url:
        engine = make_engine(url)
        with engine.begin() as conn:
            for table in ("inbox", "outbox"):
                conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
                conn.exec_driver_sql(f"ANALYZE {table}")
            conn.execute(
                text(
                    "INSERT INTO inbox (event_id, consumer, queue, priority, seq, type, headers,"
                    " state, available_at, received_at, claim_token, lease_until)"
                    " SELECT gen_random_uuid(), 'c', 'q', 1, g, 't', '{}',"
                    " CASE WHEN g % 2 = 0 THEN 'processing' ELSE 'ready' END, now(), now(),"
                    " :token, now() + interval '1 hour' FROM generate_series(1, :rows) g"
                ),
                {"token": TOKEN, "rows": ROWS},
            )
            conn.execute(
                text(
                    "INSERT INTO outbox (event_id, queue, priority, type, payload, headers,"
                    " occurred_at, available_at, status) SELECT gen_random_uuid(), 'q', 1, 't',"
                    " '{}', '{}', now(), now(), 'pending' FROM generate_series(1, :rows) g"
                ),
                {"rows": ROWS},
            )
        yield engine
        engine.dispose()


def plans_of(conn: Connection, statement: Any, parameters: dict[str, Any]) -> list[str]:
    """The plan of each of ``RUNS`` runs of ``statement``, each run rolled back."""
    notices: list[str] = []
    conn.connection.driver_connection.add_notice_handler(  # type: ignore[union-attr]
        lambda diagnostic: notices.append(diagnostic.message_primary or "")
    )
    conn.exec_driver_sql("LOAD 'auto_explain'")
    conn.exec_driver_sql("SET auto_explain.log_min_duration = 0")
    conn.exec_driver_sql("SET auto_explain.log_level = 'notice'")
    conn.commit()
    notices.clear()
    for _ in range(RUNS):
        conn.execute(statement, parameters)
        conn.rollback()
    return [n for n in notices if "plan:" in n]


def scanned_indexes(plan: str) -> set[str]:
    return set(re.findall(r"Index (?:Only )?Scan (?:Backward )?(?:using|on) (\w+)", plan))


def statements() -> dict[str, tuple[Any, dict[str, Any]]]:
    now = datetime.now(UTC)
    held = {"ids": IDS, "token": TOKEN}
    claim = {"fresh": IDS, "resumed": [], "now": now, "lease_until": now}
    failed = finish_failed(
        inbox_table, IDS[0], TOKEN, state="retry", available_at=now, last_error="x", now=now
    )
    return {
        "claim_many": (q.claim_many(inbox_table, True, arrays=True), held | claim),
        "still_held": (q.still_held(inbox_table, arrays=True), held),
        "finish_done_many": (q.finish_done_many(inbox_table, arrays=True), held | {"now": now}),
        "renew_leases": (
            q.renew_leases(inbox_table, arrays=True),
            {"ids": IDS, "tokens": [TOKEN], "lease_until": now},
        ),
        "mark_waiting_many": (
            q.mark_waiting_many(inbox_table, arrays=True),
            {"ids": IDS, "now": now},
        ),
        "finish_failed": (failed, {}),
        "relay mark_sent": (
            relay_queries.mark_sent(outbox_table, arrays=True),
            {"ids": IDS, "now": now},
        ),
        "mark_outbox_sent": (mark_outbox_sent(outbox_table, IDS, now), {}),
    }


@pytest.mark.parametrize("name", list(statements()))
def test_a_statement_naming_its_rows_reads_them_by_primary_key(
    stale_statistics: Engine, name: str
) -> None:
    statement, parameters = statements()[name]
    with stale_statistics.connect() as conn:
        plans = plans_of(conn, statement, parameters)
    assert len(plans) == RUNS, plans
    for plan in plans:
        assert scanned_indexes(plan) <= {"inbox_pkey", "outbox_pkey"}, plan
        assert scanned_indexes(plan), f"{name}: no index read\n{plan}"


def test_our_connections_plan_each_statement_for_its_parameters(
    stale_statistics: Engine,
) -> None:
    """What keeps a prepared statement off a generic plan, and a grown table off a
    sequential scan its stale statistics would choose."""
    with stale_statistics.connect() as conn:
        assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar() == "force_custom_plan"
        assert conn.exec_driver_sql("SHOW enable_seqscan").scalar() == "off"
