"""A worker started while its database does not answer: it keeps asking (a supervisor
starting it before the database is up must not see it exit), and a time limit still ends it,
with exit code 0 and a summary that says why, as the relay does."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.integration.bad_input.support import ROOT, TARGET, worker_env

UNREACHABLE = {
    "postgresql": "postgresql+psycopg://app:pw@127.0.0.1:1/app",
    "mariadb": "mysql+pymysql://app:pw@127.0.0.1:1/app",
}


@pytest.mark.parametrize("backend", sorted(UNREACHABLE))
def test_a_worker_whose_database_never_answers_keeps_trying_until_its_time_limit(
    backend: str,
) -> None:
    limit = 3.0
    cmd = [sys.executable, "-m", "outbox_cli", "worker", TARGET, "--dsn", UNREACHABLE[backend]]
    started = time.monotonic()
    proc = subprocess.run(
        [*cmd, "--time-limit", str(limit)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=worker_env("startup-consumer", ["jobs"], ["job"]),
        timeout=60,
    )
    took = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count("database not reachable at start") >= 2, out  # asked again, not once
    assert "exiting (time limit, database never reachable)" in out, out
    assert "Traceback" not in out, out
    # Ends within its limit plus interpreter start-up, not after the next outage pause.
    assert took < limit + 15, took
