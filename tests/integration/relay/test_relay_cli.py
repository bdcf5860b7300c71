"""`outbox relay` as a process: drain, signals, masking, SQLite's one-relay rule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from outbox import states
from outbox.store import Message
from tests.integration.relay.helpers import (
    RABBIT,
    read_queue,
    status_counts,
    store_rows,
    unique_queue,
    wait_for,
)

pytestmark = pytest.mark.db
OUTBOX = str(Path(sys.executable).with_name("outbox"))


def relay_cmd(dsn: str, *extra: str) -> list[str]:
    return [OUTBOX, "relay", "--dsn", dsn, "--broker", RABBIT, "--poll-interval", "0.1", *extra]


def test_stop_when_idle_drains_and_masks_passwords(
    engine: Engine, dsn: str, rabbit_names: list[str]
) -> None:
    queue = unique_queue()
    rabbit_names += [f"{queue}_1", f"{queue}_3"]
    store_rows(engine, [Message(queue, "t", {"i": i}, priority=1 + 2 * (i % 2)) for i in range(40)])

    proc = subprocess.run(
        relay_cmd(dsn, "--stop-when-idle", "--batch-size", "16"),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr
    assert status_counts(engine) == {states.SENT: 40}
    assert len(read_queue(f"{queue}_1", 20)) == 20
    assert len(read_queue(f"{queue}_3", 20)) == 20
    assert "guest:guest" not in proc.stderr + proc.stdout
    assert "guest:***@" in proc.stderr
    assert proc.stderr.count("batch: ") == 3  # one INFO line per batch: 16 + 16 + 8


def test_sigterm_finishes_batch_and_exits_zero(
    engine: Engine, dsn: str, rabbit_names: list[str], tmp_path: Path
) -> None:
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")
    log = tmp_path / "relay.log"
    proc = _spawn(relay_cmd(dsn), log)
    try:
        wait_for(lambda: "relay started" in log.read_text(), 30, "relay start")
        store_rows(engine, [Message(queue, "t", {"i": i}) for i in range(10)])
        wait_for(lambda: status_counts(engine).get(states.SENT) == 10, 30, "10 rows sent")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0
    assert time.monotonic() - started < 5
    assert len(read_queue(f"{queue}_1", 10)) == 10


def logger_names(log: str) -> list[str]:
    """The logger of each line (``date time LEVEL name[pid] message``)."""
    return [line.split()[3].split("[")[0] for line in log.splitlines()]


def test_library_loggers_stay_at_warning_unless_asked(
    engine: Engine, dsn: str, rabbit_names: list[str]
) -> None:
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")

    def drain(*extra: str, **env: str) -> subprocess.CompletedProcess[str]:
        store_rows(engine, [Message(queue, "t", {"i": i}) for i in range(3)])
        done = subprocess.run(
            relay_cmd(dsn, "--stop-when-idle", *extra), env={**os.environ, **env},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done

    # At INFO (the default), our lines and nothing from pika: it logs its connection and
    # channel life at INFO
    quiet = drain()
    names = logger_names(quiet.stderr)
    assert "relay" in names and quiet.stderr.count("batch: ") == 1, quiet.stderr
    assert {n.split(".")[0] for n in names} <= {"relay", "outbox"}, names

    # With the libraries' level at INFO, pika's lines appear, and ours follow --log-level only
    loud = drain("--log-level", "warning", OUTBOX_LIBRARY_LOG_LEVEL="INFO")
    assert any(n.startswith("pika") for n in logger_names(loud.stderr)), loud.stderr
    assert "batch: " not in loud.stderr and "relay started" not in loud.stderr
    both = drain("--library-log-level", "INFO")
    assert "batch: " in both.stderr and any(n.startswith("pika") for n in logger_names(both.stderr))
    assert status_counts(engine) == {states.SENT: 9}
    assert len(read_queue(f"{queue}_1", 9)) == 9

    # A level that does not exist is refused, naming the option
    bad = subprocess.run(
        relay_cmd(dsn, "--library-log-level", "LOUD"), capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "'--library-log-level'" in bad.stderr, bad.stderr


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stderr=out, stdout=out)


def test_empty_broker_is_an_error(dsn: str) -> None:
    proc = subprocess.run(
        [OUTBOX, "relay", "--dsn", dsn, "--broker", ""], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "broker" in proc.stderr


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_sqlite_allows_one_relay_at_a_time(
    dsn: str, rabbit_names: list[str], tmp_path: Path
) -> None:
    log = tmp_path / "first.log"
    first = _spawn(relay_cmd(dsn), log)
    try:
        wait_for(lambda: "relay started" in log.read_text(), 30, "first relay start")
        second = subprocess.run(relay_cmd(dsn), capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert "another relay is running" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=15) == 0
    # Once the first is gone, a new one starts (the kernel dropped the lock).
    third = subprocess.run(
        relay_cmd(dsn, "--stop-when-idle"), capture_output=True, text=True, timeout=60
    )
    assert third.returncode == 0, third.stderr
