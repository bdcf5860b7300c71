"""Consumer configuration, and every inbox statement compiles on every dialect."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage
from inbox.sources import source_from_url
from inbox.sources.database import DatabaseSource
from inbox.sql import finish as queries_finish
from inbox.sql import heads as queries
from inbox.sql import ingest as queries_ingest
from outbox import dialect as seam
from outbox import group_locks, inbox_table, outbox_table
from outbox.errors import ConfigError

NOW = datetime(2026, 1, 1, tzinfo=UTC)
DIALECTS = {
    "postgresql": postgresql.dialect(),
    "mysql": mysql.dialect(),
    "sqlite": sqlite.dialect(),
}


def test_handlers_are_registered_by_type() -> None:
    consumer = Consumer("c", queues=["jobs"])

    @consumer.handler("job.done")
    def handle(session: Session, message: InboxMessage) -> None:
        pass

    assert consumer.handler_for("job.done") is handle
    assert consumer.handler_for("other") is None
    with pytest.raises(ConfigError, match="already has a handler"):
        consumer.handler("job.done")(handle)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"queues": []}, "queues"),
        ({"queues": "jobs"}, "queues"),
        ({"queues": ["bad name"]}, "queues"),
        ({"on_retry": "later"}, "on_retry"),
        ({"on_dead": "ignore"}, "on_dead"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"visibility_timeout": 0}, "visibility_timeout"),
        ({"group_lock_timeout": -1}, "group_lock_timeout"),
        ({"permanent_errors": [int]}, "permanent_errors"),
        ({"backoff": 5}, "^backoff: expected an outbox.backoff.Backoff"),
    ],
)
def test_bad_settings_fail_naming_the_field(options: dict[str, Any], field: str) -> None:
    options.setdefault("queues", ["jobs"])
    with pytest.raises(ConfigError, match=field):
        Consumer("c", **options)


def _statements() -> list[Any]:
    rows = [
        {
            "event_id": uuid4(),
            "consumer": "c",
            "queue": "jobs",
            "priority": 1,
            "serial_group": "g",
            "seq": 1,
            "type": "job",
            "payload": "{}",
            "headers": "{}",
            "state": "ready",
            "available_at": NOW,
            "received_at": NOW,
        }
    ]
    t = inbox_table
    return [
        queries.candidates(t, "c", NOW, 10),
        queries.inbox_blocker(
            t, consumer="c", group="g", row_id=1, priority=1, seq=1, now=NOW, skip_retry=True
        ),
        queries.outbox_blocker(
            outbox_table,
            t,
            consumer="c",
            queues=["jobs"],
            group="g",
            priority=1,
            seq=1,
            sent_since=NOW,
        ),
        queries_finish.finish_failed(
            t, 1, uuid4(), state="retry", available_at=NOW, last_error="x", now=NOW
        ),
        queries.group_head(t, "c", "g", NOW, False),
        queries.promote(t, 1),
        queries.waiting_heads(t, "c", NOW, False),
        queries.state_counts(t, "c"),
        queries.unblock(t, "c", "g"),
        queries_ingest.mark_outbox_sent(outbox_table, [1, 2], NOW),
        ("postgresql", queries_ingest.ingest_returning(seam.POSTGRESQL, t).values(rows)),
        ("sqlite", queries_ingest.ingest_returning(seam.SQLITE, t).values(rows)),
        ("mysql", queries_ingest.ingest_mysql(t).values(rows)),
        ("postgresql", queries.notify("outbox_relay", "inbox:c")),
        ("postgresql", seam.POSTGRESQL.notify("outbox_relay", "inbox:c")),
        ("postgresql", group_locks.pg_advisory_xact_lock(1)),
        ("postgresql", group_locks.pg_try_advisory_xact_lock(1)),
        ("postgresql", group_locks.pg_lock_timeout(100)),
        ("mysql", group_locks.mysql_get_lock("obx:x", 0.5)),
        ("mysql", group_locks.mysql_release_lock("obx:x")),
    ]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_every_statement_compiles_with_bound_parameters(dialect: str) -> None:
    for item in _statements():
        if isinstance(item, tuple):
            only, statement = item
            if only != dialect:
                continue
        else:
            statement = item
        compiled = statement.compile(dialect=DIALECTS[dialect])
        assert str(compiled)
    for shape in ((), (True,), (False, True)):
        for rest in (False, True) if shape else (False,):
            locked = queries_ingest.pending_outbox(
                outbox_table, seam.by_family(dialect), shape, rest
            )
            sql = str(locked.compile(dialect=DIALECTS[dialect]))
            assert ("SKIP LOCKED" in sql) == (dialect != "sqlite")


def test_names_are_parameters_never_sql_text() -> None:
    evil = "g'; DROP TABLE inbox; --"
    statement = queries.inbox_blocker(
        inbox_table,
        consumer=evil,
        group=evil,
        row_id=1,
        priority=1,
        seq=1,
        now=NOW,
        skip_retry=False,
    )
    assert "DROP" not in str(statement.compile(dialect=postgresql.dialect()))


def test_source_from_url_picks_the_database_by_default() -> None:
    from sqlalchemy import create_engine

    engine = create_engine("sqlite://")
    source = source_from_url(
        None, engine=engine, queues=["jobs"], priorities=[1], consumer_name="c"
    )
    assert isinstance(source, DatabaseSource)
    assert isinstance(
        source_from_url("", engine=engine, queues=["jobs"], priorities=[1], consumer_name="c"),
        DatabaseSource,
    )
    with pytest.raises(ConfigError, match="not a broker URL"):
        source_from_url("redis://x", engine=engine, queues=["q"], priorities=[1], consumer_name="c")


@pytest.mark.parametrize(
    ("policies", "field"),
    [
        ({"other": {"on_retry": "skip"}}, "queue_policies['other']"),
        ({"jobs": {"on_retry": "later"}}, "queue_policies['jobs'].on_retry"),
        ({"jobs": {"on_dead": "stop"}}, "queue_policies['jobs'].on_dead"),
        ({"jobs": {"retries": 3}}, "queue_policies['jobs']"),
    ],
)
def test_bad_queue_policies_fail_naming_the_field(policies: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Consumer("c", queues=["jobs"], queue_policies=policies)
    assert str(raised.value).startswith(field)


def test_queue_policies_override_the_consumer_defaults() -> None:
    consumer = Consumer(
        "c",
        queues=["jobs", "media", "pay"],
        on_retry="block",
        queue_policies={"media": {"on_retry": "skip"}, "pay": {"on_dead": "halt"}},
    )
    assert consumer.on_retry_for("media") == "skip" and consumer.on_retry_for("jobs") == "block"
    assert consumer.on_dead_for("pay") == "halt" and consumer.on_dead_for("media") == "continue"
    assert consumer.skip_retry == ("media",)
    assert Consumer("c", queues=["jobs"], on_retry="skip").skip_retry is True
    assert Consumer("c", queues=["jobs"]).skip_retry is False


@pytest.mark.parametrize("name", ["billing ", " billing", "billing\t"])
def test_consumer_names_with_outer_whitespace_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="^name: must not start or end with whitespace"):
        Consumer(name, queues=["jobs"])
