"""The operator cores' reads the page needs, on every database: failed rows by page with
their count, retry by every listing filter, one row's audit history, halted groups and
review/unknown in the stats."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from inbox.ops import admin as inbox_admin
from outbox import states
from outbox.ops import admin
from tests.integration.ops.inbox_rows import inbox_row
from tests.integration.ops.review_rows import contract_row
from tests.integration.ops.rows import SCHEMA, outbox_row

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=3)


def test_failed_outbox_rows_by_page(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = [outbox_row(conn, status=states.FAILED, occurred_at=NOW) for _ in range(5)]
        outbox_row(conn, queue="other", status=states.FAILED, occurred_at=NOW)
    page = admin.list_failed(engine, SCHEMA, limit=2, offset=2, queue="mail")
    assert [r["id"] for r in page] == ids[2:4]
    assert admin.count_failed(engine, SCHEMA, queue="mail") == 5
    assert admin.count_failed(engine, SCHEMA) == 6


def test_retry_takes_every_listing_filter(engine: Engine) -> None:
    with engine.begin() as conn:
        new_quota = outbox_row(conn, status=states.FAILED, occurred_at=NOW, last_error="quota")
        outbox_row(conn, status=states.FAILED, occurred_at=OLD, last_error="quota")
        outbox_row(conn, status=states.FAILED, occurred_at=NOW, last_error="dns")
    result = admin.retry(
        engine, SCHEMA, now=NOW, reason="r", actor="a", error_like="quota",
        since=NOW - timedelta(days=1), dry_run=True,
    )  # fmt: skip
    assert result.ids == [new_quota]


def test_inbox_dead_rows_by_page_and_filters(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = [inbox_row(conn, state=states.FAILED, seq=i, last_error="db down")
               for i in range(1, 4)]  # fmt: skip
        inbox_row(conn, state=states.FAILED, seq=9, last_error="other")
    page = inbox_admin.list_failed(engine, limit=2, offset=1, error_like="db down")
    assert [r["id"] for r in page] == ids[1:]
    assert inbox_admin.count_failed(engine, error_like="db down") == 3
    dry = inbox_admin.retry(engine, now=NOW, reason="r", actor="a", error_like="db", dry_run=True)
    assert dry.ids == ids


def test_one_rows_audit_history(engine: Engine) -> None:
    with engine.begin() as conn:
        rows = [outbox_row(conn, status=states.FAILED, occurred_at=NOW) for _ in range(16)]
    five, fifteen = rows[4], rows[14]  # ids whose digits overlap (5 and 15, or similar)
    admin.retry(engine, SCHEMA, now=NOW, reason="only 15", actor="a", ids=[fifteen])
    admin.retry(engine, SCHEMA, now=NOW, reason="five", actor="b", ids=[five])
    with engine.begin() as conn:
        conn.execute(SCHEMA.outbox.update().values(status=states.FAILED))
    admin.retry(engine, SCHEMA, now=NOW, reason="all", actor="c", ids=rows)

    assert [h["reason"] for h in admin.history(engine, SCHEMA, five)] == ["all", "five"]
    assert [h["reason"] for h in admin.history(engine, SCHEMA, fifteen)] == ["all", "only 15"]
    assert admin.history(engine, SCHEMA, five, limit=1)[0]["actor"] == "c"


def test_inbox_rows_audit_history(engine: Engine) -> None:
    with engine.begin() as conn:
        row = inbox_row(conn, state=states.FAILED, seq=1, last_error=f"row {10 + 1} failed")
        other = inbox_row(conn, state=states.FAILED, seq=2)
    inbox_admin.retry(engine, now=NOW, reason="other only", actor="a", ids=[other])
    inbox_admin.retry(engine, now=NOW, reason="mine", actor="a", ids=[row])
    assert [h["reason"] for h in inbox_admin.history(engine, row)] == ["mine"]
    assert [h["reason"] for h in inbox_admin.history(engine, other)] == ["other only"]


def test_stats_count_halted_groups_review_and_unknown(engine: Engine) -> None:
    with engine.begin() as conn:
        inbox_row(conn, state=states.HALTED, consumer="billing", group="g1")
        inbox_row(conn, state=states.FAILED, consumer="billing", seq=2)
        contract_row(conn, state=states.REVIEW, consumer="billing", seq=3)
        contract_row(conn, state=states.UNKNOWN, consumer="billing", seq=4)
    [c] = admin.stats(engine, SCHEMA, NOW).consumers
    assert (c.failed, c.halted_groups, c.review, c.unknown) == (2, 1, 1, 1)
