"""The operator commands as an operator runs them: ``outbox ...`` subprocesses, every database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, select
from sqlalchemy.engine import URL

from outbox import states
from outbox.metrics import DATABASE_GAUGE_NAMES
from tests.integration.ops.rows import SCHEMA, outbox_row, statuses
from tests.support.services import RABBITMQ_URL, missing, port_open

OUTBOX = str(Path(sys.executable).parent / "outbox")
NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=10)


def run(dsn: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # The DSN goes through the environment, as under supervisord or cron.
    return subprocess.run(
        [OUTBOX, *args],
        env={**os.environ, "OUTBOX_DSN": dsn, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def seeded(engine: Engine) -> dict[str, int]:
    with engine.begin() as conn:
        return {
            "failed": outbox_row(
                conn, status=states.FAILED, occurred_at=OLD, attempts=5,
                last_error="SMTP 550 mailbox unavailable", payload={"to": "a@example.org"},
            ),
            "failed_sms": outbox_row(
                conn, status=states.FAILED, occurred_at=OLD, attempts=5, type_="sms",
                last_error="timeout",
            ),
            "pending": outbox_row(conn, occurred_at=NOW - timedelta(seconds=3)),
            "old_sent": outbox_row(conn, status=states.SENT, occurred_at=OLD, sent_at=OLD),
            "new_sent": outbox_row(conn, status=states.SENT, occurred_at=NOW, sent_at=NOW),
        }  # fmt: skip


def test_metrics_once(dsn: str, seeded: dict[str, int]) -> None:
    out = run(dsn, "metrics", "--once")
    assert out.returncode == 0, out.stderr
    families = {f.name: f for f in text_string_to_metric_families(out.stdout)}
    assert {n.removesuffix("_total") for n in DATABASE_GAUGE_NAMES} <= set(families)
    pending = {
        (s.labels["queue"], s.labels["priority"]): s.value
        for s in families["outbox_pending_count"].samples
    }
    assert pending == {("mail", "1"): 1.0}
    failed = [s.value for s in families["outbox_failed_count"].samples]
    assert failed == [2.0]


def test_stats_json_and_table(dsn: str, seeded: dict[str, int]) -> None:
    out = run(dsn, "stats", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (mail,) = data["queues"]
    assert (mail["queue"], mail["pending"], mail["failed"], mail["sent_last_hour"]) == (
        "mail", 1, 2, 1,
    )  # fmt: skip
    assert mail["oldest_pending_seconds"] >= 3
    table = run(dsn, "stats")
    assert table.returncode == 0, table.stderr
    assert "PENDING" in table.stdout and "mail" in table.stdout


def test_failed_list_filter_and_show(dsn: str, seeded: dict[str, int]) -> None:
    out = run(dsn, "failed", "--json", "--error-like", "550")
    assert out.returncode == 0, out.stderr
    assert [r["id"] for r in json.loads(out.stdout)] == [seeded["failed"]]

    by_env = run(dsn, "failed", "--json", OUTBOX_TYPE="sms")
    assert [r["id"] for r in json.loads(by_env.stdout)] == [seeded["failed_sms"]]

    table = run(dsn, "failed", "--since", "30d")
    assert table.returncode == 0, table.stderr
    assert "SMTP 550" in table.stdout and "2 failed row(s)" in table.stdout

    shown = run(dsn, "failed", "--show", str(seeded["failed"]), "--json")
    row = json.loads(shown.stdout)
    assert row["payload"] == {"to": "a@example.org"}
    assert row["attempts"] == 5 and row["last_error"].startswith("SMTP 550")

    missing = run(dsn, "failed", "--show", "999999")
    assert missing.returncode == 1 and "no outbox row" in missing.stderr

    bad = run(dsn, "failed", "--since", "yesterday")
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_retry_dry_run_then_for_real(dsn: str, engine: Engine, seeded: dict[str, int]) -> None:
    dry = run(dsn, "retry", "--all", "--dry-run", "--json", "--reason", "check")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["ids"] == [seeded["failed"], seeded["failed_sms"]]
    with engine.connect() as conn:
        assert statuses(conn)[seeded["failed"]] == (states.FAILED, 5)
        assert conn.execute(select(SCHEMA.audit)).first() is None

    out = run(
        dsn, "retry", "--id", str(seeded["failed"]), "--reason", "mailbox restored",
        OUTBOX_ACTOR="oncall-bob",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "retried 1 row(s)" in out.stdout
    with engine.connect() as conn:
        assert statuses(conn)[seeded["failed"]] == (states.PENDING, 0)
        assert statuses(conn)[seeded["failed_sms"]] == (states.FAILED, 5)
        audit = conn.execute(select(SCHEMA.audit)).one()._mapping
    assert (audit["actor"], audit["reason"], audit["row_ids"]) == (
        "oncall-bob", "mailbox restored", [seeded["failed"]],
    )  # fmt: skip

    # A row that is not failed: exit 1 and say which
    again = run(dsn, "retry", "--id", str(seeded["pending"]), "--reason", "x")
    assert again.returncode == 1
    assert str(seeded["pending"]) in again.stderr

    usage = run(dsn, "retry", "--reason", "x")
    assert usage.returncode == 2 and "--all" in usage.stderr


def test_compact_json(dsn: str, engine: Engine, seeded: dict[str, int]) -> None:
    out = run(dsn, "compact", "--older-than", "7d", "--batch", "1", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["deleted"] == 1 and data["batches"] == 1
    assert data["rows_per_second"] > 0
    with engine.connect() as conn:
        left = set(statuses(conn))
    assert left == set(seeded.values()) - {seeded["old_sent"]}

    text_out = run(dsn, "compact", "--older-than", "7d")
    assert "deleted 0 sent row(s)" in text_out.stdout and "rows/s" in text_out.stdout

    bad = run(dsn, "compact", "--older-than", "a week")
    assert bad.returncode == 2


def test_check_ok(dsn: str) -> None:
    out = run(dsn, "check", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    checks = json.loads(out.stdout)
    assert checks and all(c["ok"] for c in checks), checks


def test_check_with_rabbitmq(dsn: str) -> None:
    if not port_open("127.0.0.1", 5672):
        missing("rabbitmq", "nothing on 127.0.0.1:5672")
    with_broker = run(dsn, "check", "--broker", RABBITMQ_URL)
    assert with_broker.returncode == 0, with_broker.stdout
    assert "broker" in with_broker.stdout
    assert "guest:guest" not in with_broker.stdout


def test_check_fails_on_unmigrated_and_unreachable(dialect: str, tmp_path: Path) -> None:
    if dialect == "sqlite":
        unmigrated = f"sqlite:///{tmp_path / 'empty.db'}"
        unreachable = "sqlite:////nonexistent-dir/x.db"
    else:
        drv = "postgresql" if dialect == "postgresql" else "mysql"
        unmigrated = ""
        unreachable = URL.create(drv, "ops", "s3cret", "127.0.0.1", 1, "db").render_as_string(
            hide_password=False
        )
    if unmigrated:
        out = run(unmigrated, "check")
        assert out.returncode == 1
        assert "FAIL  schema" in out.stdout
    down = run(unreachable, "check")
    assert down.returncode == 1
    assert "FAIL  database" in down.stdout
    assert "s3cret" not in down.stdout + down.stderr
    for command in (["metrics", "--once"], ["stats"], ["failed"]):
        out = run(unreachable, *command)
        assert out.returncode == 1, command
        assert out.stderr.startswith("error:"), out.stderr
        assert "s3cret" not in out.stdout + out.stderr
