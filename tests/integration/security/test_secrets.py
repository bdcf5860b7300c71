"""No DSN or broker password in logs, CLI output or metrics (passwords are masked everywhere).

PostgreSQL trusts local connections whatever the password, so the database DSN carries a
distinctive one; RabbitMQ needs guest/guest, so for the broker the check is that
``guest:guest`` never appears. The relay and the worker run as OS processes at DEBUG level
(library logs included) with their /metrics served and scraped; the CLI runs its listing,
check and migrate commands, on success and on failure. Every byte of output is searched.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url

import outbox
from outbox import states
from outbox.schema import outbox_table
from tests.integration.bad_input.support import (
    ROOT,
    TARGET,
    create_effects,
    inbox_rows,
    worker_env,
)
from tests.integration.relay.publishers_fixtures import unique
from tests.support import services
from tests.support.kafka import free_port

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
SECRET = "H4bS3cretPW"
LIMIT = ("--time-limit", "2")
OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _secret_dsn(dsn: str) -> str:
    return make_url(dsn).set(password=SECRET).render_as_string(hide_password=False)


def _leaks(text: str) -> list[str]:
    found = []
    if SECRET in text:
        found.append(SECRET)
    if "guest:guest@" in text:
        found.append("guest:guest@")
    return found


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> str:
    proc = subprocess.run(
        [OUTBOX, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout
    )
    return proc.stdout + proc.stderr


def _scrape_while_running(
    cmd: list[str], port: int, done: Callable[[], bool], env: dict[str, str]
) -> str:
    """Start ``cmd``; once ``done()`` (polled, with a deadline), scrape /metrics and SIGTERM.
    Returns the scraped text and everything the process printed."""
    # A file, not a pipe: at DEBUG a pipe nobody reads fills up and blocks the process.
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed in the finally below)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    scraped = ""
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and not done():
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            scraped = str(r.read().decode())
        proc.terminate()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.seek(0)
        output = str(log.read())
        log.close()
    assert done(), f"{cmd[1:5]} did not finish; it said: {_grep(output)}"
    return scraped + output


def _outbox_sent(engine: Engine) -> bool:
    with engine.connect() as conn:
        statuses = conn.execute(select(outbox_table.c.status)).scalars().all()
    return set(statuses) == {states.SENT}


def _inbox_finished(engine: Engine, consumer: str) -> bool:
    rows = inbox_rows(engine, consumer)
    return len(rows) == 4 and {r.state for r in rows} == {states.DONE, states.FAILED}


def test_relay_worker_and_cli_never_print_a_password(engine: Engine, dsn: str) -> None:
    secret_dsn = _secret_dsn(dsn)
    queue, consumer = unique("sec-"), unique("sec-consumer-")
    create_effects(engine)
    with engine.begin() as conn:
        for i in range(3):
            outbox.store(conn, queue, "job", {"mark": f"m{i}"})
        outbox.store(conn, queue, "job", {"mark": "dead", "fail": 9})
    seen: dict[str, str] = {}

    # The relay, at DEBUG, serving /metrics
    port = free_port()
    seen["relay"] = _scrape_while_running(
        [
            OUTBOX,
            "relay",
            "--dsn",
            secret_dsn,
            "--broker",
            services.RABBITMQ_URL,
            "--poll-interval",
            "0.1",
            "--metrics-port",
            str(port),
            "--log-level",
            "DEBUG",
        ],
        port,
        lambda: _outbox_sent(engine),
        worker_env(consumer, [queue], ["job"]),
    )
    # The worker from RabbitMQ, at DEBUG, serving /metrics (a failing handler included)
    port = free_port()
    seen["worker"] = _scrape_while_running(
        [
            sys.executable,
            "-m",
            "outbox_cli",
            "worker",
            TARGET,
            "--dsn",
            secret_dsn,
            "--source",
            services.RABBITMQ_URL,
            "--poll-interval",
            "0.05",
            "--metrics-port",
            str(port),
            "--log-level",
            "DEBUG",
        ],
        port,
        lambda: _inbox_finished(engine, consumer),
        worker_env(consumer, [queue], ["job"]),
    )
    # The operator's commands, succeeding, and failing (database unreachable, unknown driver,
    # broker unreachable); run side by side, each is mostly interpreter start-up
    unreachable = f"postgresql://app:{SECRET}@127.0.0.1:1/app"
    no_broker = f"amqp://u:{SECRET}@127.0.0.1:1/"
    commands = [
        ["stats", "--json", "--dsn", secret_dsn],
        ["failed", "--dsn", secret_dsn],
        ["inbox", "failed", "--dsn", secret_dsn],
        ["metrics", "--once", "--dsn", secret_dsn],
        ["migrate", "--dsn", secret_dsn],
        ["check", "--dsn", secret_dsn, "--broker", services.RABBITMQ_URL],
        ["stats", "--dsn", unreachable],
        ["migrate", "--dsn", unreachable],
        ["relay", "--dsn", f"nosuchdb://app:{SECRET}@h/app", "--broker", services.RABBITMQ_URL],
        ["relay", "--dsn", unreachable, "--broker", services.RABBITMQ_URL, *LIMIT],
        ["relay", "--dsn", secret_dsn, "--broker", no_broker, *LIMIT],
        ["worker", TARGET, "--dsn", unreachable, *LIMIT],
        ["worker", TARGET, "--dsn", secret_dsn, "--source", no_broker, *LIMIT],
    ]
    env = worker_env(consumer, [queue], ["job"])
    with ThreadPoolExecutor(max_workers=4) as pool:
        outputs = pool.map(lambda args: _run(*args, env=env), commands)
        seen.update({" ".join(args): out for args, out in zip(commands, outputs, strict=True)})

    leaks = {what: _leaks(text) for what, text in seen.items() if _leaks(text)}
    assert leaks == {}
    assert "***" in seen["relay"]  # the relay did name its database, masked
    assert 'result="failed"' in seen["worker"]  # the scrape saw the worker's counters


@pytest.mark.parametrize(
    ("command", "url"),
    [
        ("relay", f"amqp:/guest:{SECRET}@127.0.0.1:5672/"),
        ("worker", f"amqp:/guest:{SECRET}@127.0.0.1:5672/"),
        ("relay", f"kafka://app:{SECRET}@127.0.0.1:1"),
    ],
    ids=["relay amqp:/ typo", "worker amqp:/ typo", "relay kafka with userinfo"],
)
def test_a_mistyped_broker_url_is_refused_without_echoing_its_password(
    engine: Engine, dsn: str, command: str, url: str
) -> None:
    """A broker URL missing one '/' (or Kafka with credentials, which kafka:// does not
    take) must be a clear config error naming the option, password masked."""
    env = worker_env(unique("sec-consumer-"), ["jobs"], ["job"])
    if command == "relay":
        args = ["relay", "--dsn", dsn, "--broker", url, "--time-limit", "3"]
        option = "broker"
    else:
        args = ["worker", TARGET, "--dsn", dsn, "--source", url, "--time-limit", "3"]
        option = "source"
    proc = subprocess.run(
        [OUTBOX, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    output = proc.stdout + proc.stderr
    assert _leaks(output) == [], output[-2000:]
    assert proc.returncode != 0
    assert f"error: {option}:" in proc.stderr


def _grep(output: str) -> str:
    keep = ("WARNING", "ERROR", "inbox", "consuming", "Traceback")
    return "\n".join(line[:300] for line in output.splitlines() if any(k in line for k in keep))
