"""stats, failed, retry, compact and check on every database (functions, no subprocess)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.engine import URL

from outbox import states
from outbox.dsn import make_engine
from outbox.ops import admin
from outbox.ops.check import check_database
from tests.integration.ops.rows import SCHEMA, inbox_row, outbox_row, statuses
from tests.support.databases import DatabaseFactory

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=10)


def test_stats(engine: Engine) -> None:
    with engine.begin() as conn:
        outbox_row(conn, occurred_at=NOW - timedelta(seconds=12))
        outbox_row(conn, status=states.FAILED, occurred_at=NOW)
        outbox_row(conn, status=states.SENT, occurred_at=NOW, sent_at=NOW - timedelta(minutes=5))
        outbox_row(conn, status=states.SENT, occurred_at=OLD, sent_at=OLD)  # not last hour
        outbox_row(conn, queue="audit", priority=3, status=states.SENT, occurred_at=NOW,
                   sent_at=NOW)  # fmt: skip
        inbox_row(conn, consumer="billing", state=states.DONE, seq=1, received_at=NOW,
                  duplicates=2)  # fmt: skip
        inbox_row(conn, consumer="billing", state=states.PROCESSING, seq=2, received_at=NOW)

    result = admin.stats(engine, SCHEMA, NOW)

    assert result.queues == [
        admin.QueueStats("audit", 3, 0, 0.0, 0, 1),
        admin.QueueStats("mail", 1, 1, 12.0, 1, 1),
    ]
    assert result.consumers == [admin.ConsumerStats("billing", 0, 1, 0, 2, 0.0)]


def test_failed_filters_and_show(engine: Engine) -> None:
    with engine.begin() as conn:
        a = outbox_row(conn, status=states.FAILED, occurred_at=OLD, last_error="smtp 550 100%_")
        b = outbox_row(conn, status=states.FAILED, occurred_at=NOW, type_="sms",
                       last_error="timeout", payload={"to": "+420"})  # fmt: skip
        c = outbox_row(conn, queue="other", status=states.FAILED, occurred_at=NOW)
        outbox_row(conn, occurred_at=NOW)  # pending: never listed

    def ids(**kw: object) -> list[int]:
        return [r["id"] for r in admin.list_failed(engine, SCHEMA, **kw)]  # type: ignore[arg-type]

    assert ids() == [a, b, c]
    assert ids(queue="mail") == [a, b]
    assert ids(type_="sms") == [b]
    # A substring, with LIKE wildcards taken literally.
    assert ids(error_like="100%_") == [a]
    assert ids(error_like="0%") == [a]
    assert ids(error_like="_") == [a]
    assert ids(since=NOW - timedelta(days=1)) == [b, c]
    assert ids(limit=1) == [a]

    shown = admin.show(engine, SCHEMA, b)
    assert shown is not None
    assert shown["payload"] == {"to": "+420"}
    assert shown["headers"] == {"trace": "t-1"}
    assert shown["last_error"] == "timeout"
    assert shown["status"] == states.FAILED
    json.dumps(shown)  # printable as JSON
    assert admin.show(engine, SCHEMA, 999999) is None


def test_retry_resets_failed_rows_and_writes_the_audit(engine: Engine) -> None:
    with engine.begin() as conn:
        f1 = outbox_row(conn, status=states.FAILED, occurred_at=OLD, attempts=5, last_error="x")
        f2 = outbox_row(conn, status=states.FAILED, occurred_at=OLD, attempts=5, type_="sms")
        pending = outbox_row(conn, occurred_at=OLD, attempts=2)
        sent = outbox_row(conn, status=states.SENT, occurred_at=OLD, sent_at=OLD)

    # A dry run changes nothing and writes no audit
    dry = admin.retry(engine, SCHEMA, now=NOW, reason="r", actor="ops", ids=None, dry_run=True)
    assert dry.ids == [f1, f2]
    with engine.connect() as conn:
        assert statuses(conn)[f1] == (states.FAILED, 5)
        assert conn.execute(select(SCHEMA.audit)).first() is None

    # --id: only failed rows are retried; the others are reported
    result = admin.retry(
        engine, SCHEMA, now=NOW, reason="smtp fixed", actor="alice", ids=[f1, pending, sent, 777]
    )
    assert result.ids == [f1]
    assert result.not_matched == [pending, sent, 777]
    with engine.connect() as conn:
        rows = statuses(conn)
        assert rows[f1] == (states.PENDING, 0)
        assert rows[f2] == (states.FAILED, 5)
        assert rows[pending] == (states.PENDING, 2)
        assert rows[sent] == (states.SENT, 0)
        t = SCHEMA.outbox
        assert conn.execute(select(t.c.available_at).where(t.c.id == f1)).scalar_one() == NOW
        audit = conn.execute(select(SCHEMA.audit)).one()._mapping
    assert audit["actor"] == "alice"
    assert audit["action"] == "retry"
    assert audit["reason"] == "smtp fixed"
    assert audit["row_count"] == 1
    assert audit["row_ids"] == [f1]
    assert audit["at"] == NOW

    # --all --type narrows; a second retry of the same rows finds nothing
    assert admin.retry(engine, SCHEMA, now=NOW, reason="r", actor="a", type_="sms").ids == [f2]
    assert admin.retry(engine, SCHEMA, now=NOW, reason="r", actor="a").ids == []
    with engine.connect() as conn:
        assert len(conn.execute(select(SCHEMA.audit)).all()) == 2

    with pytest.raises(ValueError, match="reason"):
        admin.retry(engine, SCHEMA, now=NOW, reason=" ", actor="a")


def test_compact_deletes_only_old_sent_rows_in_batches(engine: Engine) -> None:
    with engine.begin() as conn:
        old_sent = [
            outbox_row(conn, status=states.SENT, occurred_at=OLD, sent_at=OLD) for _ in range(25)
        ]
        recent_sent = outbox_row(conn, status=states.SENT, occurred_at=NOW, sent_at=NOW)
        old_failed = outbox_row(conn, status=states.FAILED, occurred_at=OLD, attempts=5)
        old_pending = outbox_row(conn, occurred_at=OLD)
    before = NOW - timedelta(days=7)
    assert admin.count_compactable(engine, SCHEMA, before) == 25

    seen: list[int] = []
    result = admin.compact(engine, SCHEMA, before=before, batch=10, progress=seen.append)

    assert result.deleted == 25
    assert result.batches == 3
    assert seen == [10, 10, 5]
    with engine.connect() as conn:
        left = statuses(conn)
    assert set(left) == {recent_sent, old_failed, old_pending}
    assert not set(old_sent) & set(left)
    # Nothing left to do: a second run deletes nothing.
    assert admin.compact(engine, SCHEMA, before=before, batch=10).deleted == 0


def test_compact_refuses_a_batch_over_the_parameter_limit(engine: Engine) -> None:
    with pytest.raises(ValueError, match="batch"):
        admin.compact(engine, SCHEMA, before=NOW, batch=admin.MAX_COMPACT_BATCH + 1)


def test_check_passes_on_a_migrated_database(engine: Engine) -> None:
    results = check_database(engine, SCHEMA)
    assert [r.name for r in results] == [
        "database", "schema", "indexes:outbox", "indexes:inbox", "indexes:outbox_audit",
    ]  # fmt: skip
    assert all(r.ok for r in results), results


def test_check_finds_a_missing_index(engine: Engine, dialect: str) -> None:
    with engine.begin() as conn:
        if dialect == "mariadb":
            conn.execute(text("DROP INDEX ix_outbox_key ON outbox"))
        else:
            conn.execute(text("DROP INDEX ix_outbox_key"))
    results = {r.name: r for r in check_database(engine, SCHEMA)}
    assert not results["indexes:outbox"].ok
    assert "ix_outbox_key" in results["indexes:outbox"].detail
    assert results["indexes:inbox"].ok


def test_check_finds_an_unmigrated_database(db_factory: DatabaseFactory) -> None:
    with db_factory.database(empty=True) as url:
        engine = make_engine(url)
        try:
            results = {r.name: r for r in check_database(engine, SCHEMA)}
        finally:
            engine.dispose()
    assert results["database"].ok
    assert not results["schema"].ok
    assert "outbox migrate" in results["schema"].detail
    assert not results["indexes:outbox"].ok


def test_check_unreachable_database_masks_the_password(dialect: str) -> None:
    if dialect == "sqlite":
        url = URL.create("sqlite", database="/nonexistent-dir/x.db")
    elif dialect == "postgresql":
        url = URL.create("postgresql+psycopg", "u", "s3cret", "127.0.0.1", 1, "db")
    else:
        url = URL.create("mysql+pymysql", "u", "s3cret", "127.0.0.1", 1, "db")
    engine = make_engine(url)
    results = check_database(engine, SCHEMA)
    assert [r.ok for r in results] == [False]
    assert "s3cret" not in results[0].detail
