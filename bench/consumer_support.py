"""What the parts of ``bench/consumer.py`` share: databases of their own, worker processes,
waiting, progress lines (stderr) and the table's rows.

Every database is named ``outbox_bench_consumer_<part>_<random>`` (SQLite: a file of that
name in a temporary directory) and dropped by the part that made it; another bench passes a
``prefix`` of its own (``bench/cost.py``: ``outbox_bench_cost``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import URL, make_url

from outbox.schema import schema_for
from outbox.store import Message, store_many

ROOT = Path(__file__).resolve().parents[1]
ADMIN = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/mysql",
}
AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"
CONSUMER = "bench"
GROUPS = 1000
PEER_MISSING = "n/a (pip install '.[bench]')"

Row = tuple[str, str, str, str]  # what, measured, goal, verdict


def note(message: str) -> None:
    """A progress line on stderr: the runs take minutes, the table goes to stdout."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def verdict(ok: bool, detail: str) -> str:
    return "MET" if ok else f"missed ({detail})"


def ratio_verdict(value: float, goal: float) -> str:
    return verdict(value >= goal, f"{value / goal:.2f} of goal")


def unique_name(tag: str, prefix: str = "outbox_bench_consumer") -> str:
    return f"{prefix}_{tag}_{uuid.uuid4().hex[:8]}"


def create_database(dialect: str, tag: str, prefix: str = "outbox_bench_consumer") -> URL:
    name = unique_name(tag, prefix)
    if dialect == "sqlite":
        folder = tempfile.mkdtemp(prefix="outbox_bench_")
        return make_url(f"sqlite:///{folder}/{name}.db")
    admin = create_engine(ADMIN[dialect], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if dialect == "postgresql":
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        else:
            conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    admin.dispose()
    return make_url(ADMIN[dialect]).set(database=name)


def drop_database(dialect: str, url: URL) -> None:
    if dialect == "sqlite":
        shutil.rmtree(Path(str(url.database)).parent, ignore_errors=True)
        return
    admin = create_engine(ADMIN[dialect], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if dialect == "postgresql":
            conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
        else:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{url.database}`"))
    admin.dispose()


def analyze(engine: Engine, dialect: str, table: str) -> None:
    if dialect == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM ANALYZE {table}"))
    elif dialect == "mariadb":
        with engine.begin() as conn:
            conn.execute(text(f"ANALYZE TABLE {table}"))
    else:
        with engine.begin() as conn:
            conn.execute(text(f"ANALYZE {table}"))


def dsn_of(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def libpq_dsn(url: URL) -> str:
    """The same database for psycopg/libpq directly (procrastinate, pgqueuer, pgbench)."""
    return dsn_of(url.set(drivername="postgresql"))


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def priority_of(i: int) -> int:
    """Mixed priorities 1..9 (1 most urgent), the same sequence for every queue compared."""
    return 1 + (i * 7) % 9


def group_of(i: int) -> str:
    return f"group-{i % GROUPS}"


def store_messages(
    engine: Engine, queue: str, type_: str, n: int, grouped: bool, chunk: int = 1000
) -> None:
    """``n`` outbox rows through ``store_many`` (the producer's API), 1,000 per commit."""
    for start in range(0, n, chunk):
        batch = [
            Message(
                queue,
                type_,
                {"i": i},
                priority=priority_of(i),
                serial_group=group_of(i) if grouped else None,
            )
            for i in range(start + 1, min(n, start + chunk) + 1)
        ]
        with engine.begin() as conn:
            store_many(conn, batch)


def inbox_span(engine: Engine, exclude: Sequence[uuid.UUID] = ()) -> float:
    """Seconds from the first message taken (outbox ``sent_at``; the database source marks it
    as it ingests, a relay as the broker confirms) to the last handler done."""
    tables = schema_for()
    inbox, outbox = tables.inbox, tables.outbox
    with engine.connect() as conn:
        first = conn.execute(
            select(func.min(outbox.c.sent_at)).where(outbox.c.event_id.not_in(exclude))
        ).scalar_one()
        first_received = conn.execute(
            select(func.min(inbox.c.received_at)).where(inbox.c.event_id.not_in(exclude))
        ).scalar_one()
        last = conn.execute(
            select(func.max(inbox.c.finished_at)).where(inbox.c.event_id.not_in(exclude))
        ).scalar_one()
    starts = [t for t in (first, first_received) if isinstance(t, datetime)]
    return float((last - min(starts)).total_seconds())


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    # A default-batch run must not inherit a batch size from the shell (under the name of
    # the worker measured: older ones read OUTBOX_BATCH_SIZE, newer refuse it).
    env.pop("OUTBOX_BATCH_SIZE", None)
    env.pop("OUTBOX_WORKER_BATCH_SIZE", None)
    env.update(extra or {})
    return env


@functools.cache
def worker_batch_default() -> str | None:
    """The worker's ``--batch-size`` default as its ``--help`` prints it ("?" when it prints
    none), or None while the worker has no such option (it would reject it)."""
    out = subprocess.run(
        [sys.executable, "-m", "outbox_cli", "worker", "--help"],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found = re.search(r"--batch-size\b(.*?)(?:\n  -|\Z)", out, re.S)
    if found is None:
        return None
    default = re.search(r"default:\s*(\d+)", found.group(1))
    return default.group(1) if default else "?"


def spawn_ours(
    dsn: str,
    extra: Sequence[str] = (),
    *,
    idle: bool = True,
    env: dict[str, str] | None = None,
    batch: int | None = None,
    handlers: str = "bench.consumer_handlers:consumer",
) -> subprocess.Popen[bytes]:
    """One ``outbox worker`` process; ``batch`` None: the worker's own default."""
    args = [sys.executable, "-m", "outbox_cli", "worker", handlers, "--dsn", dsn]
    args += ["--log-level", "WARNING", "--time-limit", "1800", *extra]
    if batch is not None:
        args += ["--batch-size", str(batch)]
    if idle:
        args.append("--stop-when-idle")
    return subprocess.Popen(args, cwd=ROOT, env=python_env(env))


def spawn_relay(
    dsn: str, broker: str, queue: str, extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "outbox_cli", "relay", "--dsn", dsn, "--broker", broker]
    args += ["--queue", queue, "--log-level", "WARNING", *extra]
    return subprocess.Popen(args, cwd=ROOT, env=python_env())


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    processes: Sequence[subprocess.Popen[bytes]] = (),
) -> None:
    """Poll ``condition``; fail early when every process it waits on has exited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if processes and all(p.poll() is not None for p in processes) and not condition():
            codes = [p.returncode for p in processes]
            raise RuntimeError(f"{what}: every process exited ({codes}) before the end")
        time.sleep(0.2)


def wait_for_count(
    count: Callable[[], int],
    target: int,
    what: str,
    processes: Sequence[subprocess.Popen[bytes]] = (),
    timeout: float = 1800,
    stall: float = 120,
) -> None:
    """``wait_until`` count() >= target; fail when the count has not moved for ``stall``
    seconds (workers alive but failing in a loop would otherwise hold the run for ``timeout``)."""
    last, moved = -1, time.monotonic()

    def done() -> bool:
        nonlocal last, moved
        now = count()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise RuntimeError(f"{what}: stuck at {now}/{target} for {stall:.0f}s")
        return now >= target

    wait_until(done, timeout, what, processes)


def stop_all(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
