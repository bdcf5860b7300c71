"""Bad input on the operator's side: a bad option of ``outbox relay`` / ``outbox worker`` is a
clean error naming the option (``error: <option>: ...``, exit status 1 or click's 2), never
a traceback, and never a password (the DSN here carries one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.bad_input.support import ROOT, TARGET, worker_env
from tests.support import services

OUTBOX = str(Path(sys.executable).with_name("outbox"))
SECRET = "H4bCfgS3cret"
DSN = f"postgresql://postgres:{SECRET}@127.0.0.1:5432/postgres"
RABBIT = services.RABBITMQ_URL

CASES: list[tuple[str, list[str], str]] = [
    # (case, arguments, the option the error must name)
    ("relay: broker scheme", ["relay", "--dsn", DSN, "--broker", f"ftp://u:{SECRET}@h"], "broker"),
    ("relay: kafka without host", ["relay", "--dsn", DSN, "--broker", "kafka://"], "broker"),
    ("relay: empty broker", ["relay", "--dsn", DSN, "--broker", " "], "broker"),
    ("relay: unparsable dsn", ["relay", "--dsn", "not a url", "--broker", RABBIT], "dsn"),
    (
        "relay: unknown database driver",
        ["relay", "--dsn", f"nosuchdb://u:{SECRET}@h/db", "--broker", RABBIT],
        "dsn",
    ),
    (
        "relay: queue arguments not JSON",
        ["relay", "--dsn", DSN, "--broker", RABBIT, "--queue-arguments", "{bad"],
        "queue-arguments",
    ),
    (
        "relay: queue arguments not an object",
        ["relay", "--dsn", DSN, "--broker", RABBIT, "--queue-arguments", "[1]"],
        "queue-arguments",
    ),
    (
        "relay: backoff base over max",
        ["relay", "--dsn", DSN, "--broker", RABBIT, "--backoff-base", "5", "--backoff-max", "1"],
        "backoff",
    ),
    (
        "worker: source scheme",
        ["worker", TARGET, "--dsn", DSN, "--source", f"ftp://u:{SECRET}@h"],
        "source",
    ),
    ("worker: unknown database driver", ["worker", TARGET, "--dsn", "nosuchdb://h/db"], "dsn"),
]


@pytest.mark.parametrize(("case", "args", "option"), CASES, ids=[c[0] for c in CASES])
def test_bad_option_is_a_clear_error_naming_it(case: str, args: list[str], option: str) -> None:
    proc = subprocess.run(
        [OUTBOX, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=worker_env("cfg-consumer", ["jobs"], ["job"]),
        timeout=60,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2), output[-2000:]
    assert "Traceback" not in output, output[-2000:]
    assert SECRET not in output
    assert f"error: {option}:" in proc.stderr, proc.stderr[-2000:]
