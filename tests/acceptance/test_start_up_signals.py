"""A worker or a relay stopped (SIGTERM, SIGINT) at any instant of its start-up exits 0 within a
second: a supervisor that stops it while it waits for its database, or right after starting
it, must not see a failure, nor wait.

"Any instant" starts when Python runs the entry point (``outbox_cli/__main__.py``), which
catches both signals before it imports anything: the tests watch for that in
``/proc/<pid>/status`` (SigCgt). Before it, in the interpreter's own start, a signal takes its
default action, which no code of ours can change.

Not covered: a relay whose database or broker takes the connection and never answers waits in
the driver's connect (its own timeout) before it sees the stop; the worker's start-up check
does not (``test_a_worker_stopped_while_its_database_...``).
"""

from __future__ import annotations

import os
import random
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support import services
from tests.support.workers import ROOT

# Closed local ports: connections are refused at once, and the start-up retry goes on.
DATABASE_DOWN = {
    "postgresql": "postgresql+psycopg://app:pw@127.0.0.1:1/app",
    "mariadb": "mysql+pymysql://app:pw@127.0.0.1:1/app",
}
# What each logs when it waits for its database (after its stop handling is installed).
WAITING = {"worker": "database not reachable at start", "relay": "database unavailable"}
STOPS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}
WITHIN = 1.0


def _command(kind: str, dsn: str) -> list[str]:
    if kind == "worker":
        target = "tests.integration.bad_input.app:consumer"
        return [sys.executable, "-m", "outbox_cli", "worker", target, "--dsn", dsn]
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")  # the relay connects it first
    broker = services.RABBITMQ_URL
    return [sys.executable, "-m", "outbox_cli", "relay", "--dsn", dsn, "--broker", broker]


def _spawn(kind: str, dsn: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env.update(H4B_CONSUMER="start-up", H4B_QUEUES='["jobs"]', H4B_TYPES='["job"]')
    return subprocess.Popen(
        _command(kind, dsn), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _read_until(proc: subprocess.Popen[bytes], marker: str, timeout: float) -> str:
    """The child's stderr up to ``marker``; fails at the deadline with what it said."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    said = b""
    while marker.encode() not in said:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(proc.stderr.fileno(), 65536) if ready else b""
        if not chunk:
            proc.kill()
            proc.wait()
            raise AssertionError(f"no {marker!r} within {timeout} s: {said.decode()}")
        said += chunk
    return said.decode()


def _catches_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def _spawn_caught(kind: str, dsn: str) -> subprocess.Popen[bytes]:
    """Spawned, and back the moment its entry point catches SIGTERM (looked for without a
    pause between looks: that first instant is the one under test)."""
    proc = _spawn(kind, dsn)
    deadline = time.monotonic() + 60
    while not _catches_sigterm(proc.pid):
        assert time.monotonic() < deadline, "SIGTERM not caught within 60 s"
    return proc


def _stop(proc: subprocess.Popen[bytes], signum: signal.Signals, said: str = "") -> str:
    """Send ``signum``; the child must exit 0 within WITHIN seconds. Returns its stderr."""
    proc.send_signal(signum)
    sent = time.monotonic()
    try:
        _, rest = proc.communicate(timeout=30)  # draining stderr: a full pipe blocks a child
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"still running 30 s after {signum.name}: {said}") from None
    took = time.monotonic() - sent
    out = said + rest.decode()
    assert proc.returncode == 0, f"exit code {proc.returncode} after {signum.name}: {out}"
    assert took <= WITHIN, f"exited {took:.2f} s after {signum.name}: {out}"
    assert "Traceback" not in out, out
    return out


# Each command, database and signal at least once (the signals share one path in each).
@pytest.mark.parametrize(
    ("kind", "backend", "stop"),
    [
        ("worker", "postgresql", "SIGTERM"),
        ("worker", "mariadb", "SIGINT"),
        ("relay", "postgresql", "SIGINT"),
        ("relay", "mariadb", "SIGTERM"),
    ],
)
def test_stopped_while_waiting_for_its_database_it_exits_0_within_a_second(
    kind: str, backend: str, stop: str
) -> None:
    proc = _spawn(kind, DATABASE_DOWN[backend])
    said = _read_until(proc, WAITING[kind], timeout=60)
    out = _stop(proc, STOPS[stop], said)
    assert f"{stop}: finishing" in out, out  # its own stop handling, not the early exit


@pytest.mark.parametrize("backend", sorted(DATABASE_DOWN))
def test_a_worker_stopped_while_its_database_takes_the_connection_and_never_answers_exits_0(
    backend: str,
) -> None:
    # A hung server (or a host that drops packets): the driver's connect waits for minutes, or
    # for ever, and the worker's start-up check must not keep a stop waiting for it.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        dsn = DATABASE_DOWN[backend].replace("127.0.0.1:1/", f"127.0.0.1:{port}/")
        proc = _spawn("worker", dsn)
        ready, _, _ = select.select([silent], [], [], 60)
        assert ready, "the worker never connected"
        connection, _ = silent.accept()  # the worker now waits in its connect
        with connection:
            _stop(proc, signal.SIGTERM)


@pytest.mark.parametrize("stop", sorted(STOPS))
@pytest.mark.parametrize("kind", ["worker", "relay"])
def test_stopped_the_moment_it_catches_stop_signals_it_exits_0_within_a_second(
    kind: str, stop: str
) -> None:
    _stop(_spawn_caught(kind, DATABASE_DOWN["postgresql"]), STOPS[stop])


@pytest.mark.parametrize("kind", ["worker", "relay"])
def test_stopped_at_random_instants_of_its_start_up_it_exits_0_within_a_second(
    kind: str,
) -> None:
    # The start-up's length on this machine: from catching signals to waiting for the database.
    proc = _spawn_caught(kind, DATABASE_DOWN["mariadb"])
    caught = time.monotonic()
    said = _read_until(proc, WAITING[kind], timeout=60)
    length = time.monotonic() - caught
    _stop(proc, signal.SIGTERM, said)
    seed = random.randrange(2**32)
    instants = random.Random(seed)
    for round_ in range(6):
        proc = _spawn_caught(kind, DATABASE_DOWN["mariadb"])
        time.sleep(instants.uniform(0, length))  # the instant under test, not a wait for a state
        try:
            _stop(proc, signal.SIGINT if round_ % 2 else signal.SIGTERM)
        except AssertionError as exc:
            raise AssertionError(
                f"round {round_}, seed {seed}, start-up {length:.2f} s: {exc}"
            ) from exc
