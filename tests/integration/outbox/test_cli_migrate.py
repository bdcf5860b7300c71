"""``outbox migrate`` as an operator runs it: a real process against a real database."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import inspect

from outbox.dsn import make_engine
from outbox.migrate import head_revision
from tests.support.databases import DatabaseFactory

OUTBOX = [sys.executable, "-m", "outbox_cli"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OUTBOX, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_migrate_creates_then_reports_up_to_date(db_factory: DatabaseFactory) -> None:
    with db_factory.database(empty=True) as url:
        dsn = url.render_as_string(hide_password=False)
        first = run("migrate", env={"OUTBOX_DSN": dsn})
        assert first.returncode == 0, first.stderr
        assert f"migrated from nothing to revision {head_revision()}" in first.stdout
        second = run("migrate", "--dsn", dsn)
        assert second.returncode == 0, second.stderr
        assert f"already at revision {head_revision()}" in second.stdout
        engine = make_engine(url)
        assert {"outbox", "inbox"} <= set(inspect(engine).get_table_names())
        engine.dispose()


def test_migrate_sql_prints_without_touching_the_database(db_factory: DatabaseFactory) -> None:
    with db_factory.database(empty=True) as url:
        result = run("migrate", "--sql", "--dsn", url.render_as_string(hide_password=False))
        assert result.returncode == 0, result.stderr
        assert "CREATE TABLE outbox" in result.stdout
        engine = make_engine(url)
        assert "outbox" not in inspect(engine).get_table_names()
        engine.dispose()


def test_unreachable_database_fails_cleanly_with_password_masked() -> None:
    result = run("migrate", "--dsn", "postgresql://app:hunter2@127.0.0.1:1/nowhere")
    assert result.returncode == 1
    assert "hunter2" not in result.stderr + result.stdout
    assert result.stderr.startswith("error: migrate on postgresql+psycopg://app:***@127.0.0.1:1")
    assert "Traceback" not in result.stderr


def test_missing_dsn_is_a_usage_error() -> None:
    result = run("migrate", env={"OUTBOX_DSN": ""})
    assert result.returncode == 2
    assert "OUTBOX_DSN" in result.stderr or "--dsn" in result.stderr
