"""deploy/supervisord.conf under a real supervisord: two relays share the work, are restarted
after a clean periodic exit, and `supervisorctl stop` ends them with exit status 0.

The shipped file restarts on --time-limit; the test swaps in --max-messages (the same clean
exit-0 path) so that restarts happen only while messages flow and the final stop never lands
in a process that is still importing (before its SIGTERM handler exists). It keeps only the
relays (the workers and the file as shipped: tests/acceptance/test_supervisord_deploy.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
from tests.support import services

CONF = Path(__file__).resolve().parents[3] / "deploy" / "supervisord.conf"
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_two_relays_under_supervisord(
    engine: Engine, dsn: str, rabbit_names: list[str], tmp_path: Path
) -> None:
    if not (BIN / "supervisord").exists():
        services.missing("supervisord", f"not in {BIN} (pip supervisor, a test dependency)")
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")
    conf = tmp_path / "supervisord.conf"
    shipped = CONF.read_text()
    metrics = " --metrics-port %(ENV_OUTBOX_RELAY_METRICS_PREFIX)s%(process_num)d"
    assert "--time-limit 3600" + metrics in shipped
    relays_only = re.sub(r"^\[program:worker\].*?(?=^\[|\Z)", "", shipped, flags=re.M | re.S)
    assert "[program:relay]" in relays_only and "program:worker" not in relays_only
    assert "startsecs=1" in relays_only
    conf.write_text(
        relays_only.replace(
            "--time-limit 3600" + metrics, "--max-messages 30 --batch-size 10 --poll-interval 0.1"
        )
        # A run of 30 messages can end within the shipped startsecs=1, which supervisord
        # counts as a failed start (backoff, then FATAL); an hour-long run never does.
        .replace("startsecs=1", "startsecs=0")
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "OUTBOX_DSN": dsn,
        "OUTBOX_BROKER": RABBIT,
    }
    ctl = [str(BIN / "supervisorctl"), "-c", str(conf)]
    supervisord = subprocess.Popen([str(BIN / "supervisord"), "-n", "-c", str(conf)], env=env)
    logs = [tmp_path / "relay_0.log", tmp_path / "relay_1.log"]
    try:
        store_rows(engine, [Message(queue, "t", {"i": i}) for i in range(100)])
        wait_for(lambda: status_counts(engine) == {states.SENT: 100}, 60, "first 100 sent")
        # The restarted relays keep publishing
        store_rows(engine, [Message(queue, "t", {"i": i}) for i in range(100, 200)])
        wait_for(lambda: status_counts(engine) == {states.SENT: 200}, 60, "next 100 sent")
        # (the exit is logged just after the batch's commit: wait for it, do not race it)
        wait_for(
            lambda: sum(p.read_text().count("exiting (max messages)") for p in logs) >= 4,
            60,
            "clean exits after --max-messages",
        )
        wait_for(lambda: all(_running(p) for p in logs), 60, "both relays up and idle")
        stop = subprocess.run([*ctl, "stop", "all"], capture_output=True, text=True, env=env)
        assert stop.returncode == 0, stop.stdout + stop.stderr
    finally:
        subprocess.run([*ctl, "shutdown"], capture_output=True, env=env)
        supervisord.wait(timeout=60)
    main_log = (tmp_path / "supervisord.log").read_text()
    # Which relay reached --max-messages first is up to SKIP LOCKED: either may have exited
    exits = re.findall(r"exited: relay_\d \(exit status 0; expected\)", main_log)
    assert len(exits) >= 4, main_log
    assert "not expected" not in main_log, main_log
    assert "stopped: relay_0 (exit status 0)" in main_log
    assert "stopped: relay_1 (exit status 0)" in main_log
    assert len({d.envelope.event_id for d in read_queue(f"{queue}_1", 200)}) == 200


def _running(log: Path) -> bool:
    """Started once more than it exited: the current process is past its start-up."""
    text = log.read_text()
    return text.count("relay started") == text.count("relay exiting") + 1
