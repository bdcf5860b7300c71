"""The shipped deployment examples, as shipped.

``deploy/supervisord.conf`` under a real supervisord, byte for byte (only its environment
variables differ): two relays and two workers on PostgreSQL + RabbitMQ serve their metrics,
every message takes effect exactly once with each serial group in (priority, id) order, and
``supervisorctl stop all`` ends all four processes with exit status 0, nothing left behind.

``deploy/outbox-*@.service``: ``systemd-analyze verify`` finds nothing to say (when the tool
is there), and the keys the deployment relies on are set.
"""

from __future__ import annotations

import collections
import configparser
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from inbox.rules import expected_order
from outbox import Message, inbox_table, outbox_table, states, store_many
from tests.integration.relay.helpers import RABBIT, rabbit_channel, rabbit_names, require_rabbitmq
from tests.support import services
from tests.support.workers import ROOT, Bed, completed_order, overlaps, wait_for

__all__ = ["rabbit_names"]  # the fixture that deletes the test's RabbitMQ queues

DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
TARGET = "tests.support.handlers:consumer"
RELAYS, WORKERS = ("relay_0", "relay_1"), ("worker_0", "worker_1")
# The public metric names, by the process that serves them
RELAY_NAMES = {
    "outbox_pending_count", "outbox_pending_seconds", "outbox_failed_count",
    "outbox_published_total", "outbox_publish_errors_total", "outbox_relay_batch_seconds",
    "outbox_delivery_lag_seconds",
}  # fmt: skip
WORKER_NAMES = {
    "inbox_processed_total", "inbox_duplicates_total", "inbox_waiting_count",
    "inbox_group_blocked_seconds", "inbox_handler_seconds", "inbox_end_to_end_seconds",
}  # fmt: skip
GROUPS = 3
PER_GROUP = 10
UNGROUPED = 20
TOTAL = GROUPS * PER_GROUP + UNGROUPED


def _supervisor_bin(name: str) -> str:
    """The venv's (pip ``supervisor``, a test dependency) or the system's (Debian)."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if found is None:
        services.missing("supervisord", f"{name} is neither in {BIN} nor on PATH")
    return str(found)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_prefix(taken: set[int]) -> int:
    """A prefix P whose ports P0 and P1 are free (the configs' ports are PREFIX + process)."""
    while True:
        prefix = random.randint(2000, 6499)
        ports = {prefix * 10, prefix * 10 + 1}
        if not ports & taken and all(_port_free(p) for p in ports):
            taken.update(ports)
            return prefix


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _sum(text: str, prefix: str, label: str = "") -> float:
    """The sum of the samples whose line starts with ``prefix`` and holds ``label``."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and label in line
    )


def _total(ports: list[int], prefix: str, label: str = "") -> float:
    return sum(_sum(_scrape(port), prefix, label) for port in ports)


def _declared(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))


def _jobs(queue: str) -> list[list[Message]]:
    """One transaction per group (priorities 1..3 mixed), then the ungrouped jobs."""
    rng = random.Random(5)
    batches = [
        [
            Message(
                queue,
                "job",
                {"mark": f"g{g}-{i}", "sleep": 0.01},
                priority=rng.randint(1, 3),
                serial_group=f"group-{g}",
            )
            for i in range(PER_GROUP)
        ]
        for g in range(GROUPS)
    ]
    batches.append([Message(queue, "job", {"mark": f"u-{i}"}) for i in range(UNGROUPED)])
    return batches


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_shipped_supervisord_conf_runs_relays_and_workers(
    bed: Bed, rabbit_names: list[str], tmp_path: Path
) -> None:
    require_rabbitmq()
    supervisord, supervisorctl = _supervisor_bin("supervisord"), _supervisor_bin("supervisorctl")
    queue = f"deploy_{uuid.uuid4().hex[:10]}"
    rabbit_names.extend(f"{queue}_{p}" for p in range(1, 10))  # workers declare all nine
    consumer = f"deploy-{queue}"
    # The shipped file, unchanged: %(here)s puts the runtime files in tmp_path.
    conf = tmp_path / "supervisord.conf"
    shutil.copyfile(DEPLOY / "supervisord.conf", conf)
    assert conf.read_bytes() == (DEPLOY / "supervisord.conf").read_bytes()
    taken: set[int] = set()
    relay_prefix, worker_prefix = _port_prefix(taken), _port_prefix(taken)
    env = {
        **bed.env(queues=[queue], consumer=consumer),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "OUTBOX_DSN": bed.dsn,
        "OUTBOX_BROKER": RABBIT,
        "OUTBOX_SOURCE": RABBIT,
        "OUTBOX_WORKER_TARGET": TARGET,
        "OUTBOX_RELAY_METRICS_PREFIX": str(relay_prefix),
        "OUTBOX_WORKER_METRICS_PREFIX": str(worker_prefix),
        "OUTBOX_RELAY_POLL_INTERVAL": "0.1",
        "OUTBOX_WORKER_POLL_INTERVAL": "0.1",
    }
    ctl = [supervisorctl, "-c", str(conf)]
    daemon = subprocess.Popen(
        [supervisord, "-n", "-c", str(conf)], cwd=ROOT, env=env, start_new_session=True
    )
    log = {name: tmp_path / f"{name}.log" for name in (*RELAYS, *WORKERS)}
    batches = _jobs(queue)
    try:
        for batch in batches:
            with bed.engine.begin() as conn:
                store_many(conn, batch)
        wait_for(lambda: _done(bed, consumer) == TOTAL, 120, f"{TOTAL} messages done")
        # Every process is past its start-up (signal handlers installed) before the stop
        wait_for(lambda: all(_logged(log[r], "relay started") for r in RELAYS), 30, "relays")
        wait_for(lambda: all(_logged(log[w], "consuming ") for w in WORKERS), 30, "workers")

        # The counters move just after the commits we waited for: poll them too
        relay_ports = [relay_prefix * 10 + i for i in range(2)]
        worker_ports = [worker_prefix * 10 + i for i in range(2)]
        wait_for(
            lambda: (
                _total(relay_ports, "outbox_published_total{") == TOTAL
                and _total(worker_ports, "inbox_processed_total{", 'result="done"') == TOTAL
            ),
            30,
            "the counters",
        )
        for port in relay_ports:
            assert not RELAY_NAMES - _declared(_scrape(port))
        for port in worker_ports:
            assert not WORKER_NAMES - _declared(_scrape(port))
        # (a transient database error may add a "retry" result; "done" is once per message)
        assert _total(worker_ports, "inbox_processed_total{", 'result="failed"') == 0

        stop = subprocess.run([*ctl, "stop", "all"], capture_output=True, text=True, env=env)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        status = subprocess.run([*ctl, "status"], capture_output=True, text=True, env=env)
        lines = status.stdout.strip().splitlines()
        assert len(lines) == 4, status.stdout
        assert all(line.split()[1] == "STOPPED" for line in lines), status.stdout
    except BaseException:
        _print_logs(tmp_path)  # shown by pytest with the failure
        raise
    finally:
        subprocess.run([*ctl, "shutdown"], capture_output=True, env=env)
        try:
            daemon.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
    try:
        _check_supervisord_log((tmp_path / "supervisord.log").read_text())
        _check_nothing_lost(bed, consumer, queue, batches)
    except BaseException:
        _print_logs(tmp_path)
        raise


def _check_supervisord_log(main_log: str) -> None:
    """Each process started once (never crashed), and stopped with exit status 0."""
    for name in (*RELAYS, *WORKERS):
        assert main_log.count(f"spawned: '{name}'") == 1, main_log
        assert f"stopped: {name} (exit status 0)" in main_log, main_log
    for bad in ("FATAL", "BACKOFF", "not expected", "SIGKILL", "terminated by"):
        assert bad not in main_log, main_log


def _done(bed: Bed, consumer: str) -> int:
    with bed.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    inbox_table.c.consumer == consumer, inbox_table.c.state == states.DONE
                )
            ).scalar_one()
        )


def _print_logs(directory: Path) -> None:
    for path in sorted(directory.glob("*_[0-9].log")):
        lines = [line for line in path.read_text().splitlines() if " pika." not in line]
        print(f"--- {path.name} (last 30 lines, pika's left out)", *lines[-30:], sep="\n")


def _logged(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


def _check_nothing_lost(bed: Bed, consumer: str, queue: str, batches: list[list[Message]]) -> None:
    with bed.engine.connect() as conn:
        outbox_rows = conn.execute(select(outbox_table.c.event_id, outbox_table.c.status)).all()
        inbox_rows = conn.execute(
            select(inbox_table.c.event_id, inbox_table.c.state).where(
                inbox_table.c.consumer == consumer
            )
        ).all()
    assert len(outbox_rows) == TOTAL
    assert {status for _, status in outbox_rows} == {states.SENT}
    assert len(inbox_rows) == TOTAL
    assert {state for _, state in inbox_rows} == {states.DONE}
    effects = collections.Counter(e.event_id for e in bed.effects())
    assert set(effects) == {event_id for event_id, _ in outbox_rows}
    assert set(effects.values()) == {1}  # each effect exactly once
    events = bed.events()
    for g, batch in enumerate(batches[:GROUPS]):
        group = f"group-{g}"
        assert overlaps(events, group) == []
        wanted = expected_order([(m.payload["mark"], m.priority) for m in batch])
        assert completed_order(events, group) == wanted
    # Nothing waits at the broker either: every delivery was acknowledged
    with rabbit_channel() as channel:
        for priority in (1, 2, 3):
            declared = channel.queue_declare(f"{queue}_{priority}", passive=True)
            assert declared.method.message_count == 0


# --- systemd units ---------------------------------------------------------------------------

UNITS = {
    "outbox-relay@.service": ("relay", "910%i", "40"),
    "outbox-worker@.service": ("worker", "911%i", "60"),
}


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=True, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEPLOY / name).read_text())
    return parser


@pytest.mark.parametrize("name", sorted(UNITS))
def test_systemd_unit_keys(name: str) -> None:
    command, port, stop_seconds = UNITS[name]
    unit = _unit(name)
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    exec_start = service["ExecStart"].split()
    assert exec_start[0].startswith("/") and exec_start[0].endswith("/outbox")
    assert exec_start[1] == command
    assert "--time-limit" in exec_start and "--metrics-port" in exec_start
    assert exec_start[exec_start.index("--metrics-port") + 1] == port
    # --time-limit exits 0 on purpose: restarted whatever the exit code
    assert service["Restart"] == "always"
    assert service["KillSignal"] == "SIGTERM"
    assert service["TimeoutStopSec"] == stop_seconds
    assert "EnvironmentFile" in service  # the DSN and the broker: never on the command line
    assert not any("://" in value for value in service.values())
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.parametrize("name", sorted(UNITS))
def test_systemd_analyze_verify(name: str) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        services.missing("systemd-analyze", "not on PATH (Debian package systemd)")
    done = subprocess.run(
        [tool, "verify", "--man=no", str(DEPLOY / name)], capture_output=True, text=True
    )
    executable = _unit(name)["Service"]["ExecStart"].split()[0]
    # The one thing a test machine cannot have: the documented install path.
    complaints = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and f"Command {executable} is not executable" not in line
    ]
    assert complaints == [], done.stdout + done.stderr
