"""The peers of parts b and c, each on a PostgreSQL database of its own, and the floor.

- procrastinate: ``procrastinate worker``, 2 processes, ``--concurrency 1``; groups are its
  ``lock``; jobs/s = n / (last ``succeeded`` event - first ``started`` event).
- pgqueuer: installed by ``python -m pgqueuer install``, run by ``python -m
  bench.consumer_pgq`` (``pgqueuer.run``, as ``pgq run`` does: its default batch size), 2
  processes, on the psycopg driver (the goal's peer) and, as a report, on asyncpg (what
  ``pgq`` picks first when it is installed); no groups (it has no equivalent); jobs/s = n / (last
  ``successful`` log row - first ``picked`` log row).
- pgbench: ``BEGIN; UPDATE one row; INSERT one row; COMMIT;``, 2 clients, prepared
  statements: the transactions/s a claim + finish of one message per commit cannot beat.

Each returns None when its package (or program) is not installed: the table prints n/a.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from sqlalchemy import Engine, text

from bench.consumer_handlers import effect_metadata
from bench.consumer_support import (
    GROUPS,
    ROOT,
    analyze,
    create_database,
    drop_database,
    libpq_dsn,
    note,
    python_env,
    scalar,
    stop_all,
    wait_for_count,
)
from outbox.dsn import make_engine

Measured = tuple[float, float]  # jobs/s, wall seconds incl. start-up

# procrastinate: a larger number is more urgent; its lock serialises a group.
PG_PROCRASTINATE = """
INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, args)
SELECT 'bench', :task, -(1 + (g * 7) % 9),
       CASE WHEN :grouped THEN 'group-' || (g % :groups) END, jsonb_build_object('i', g)
FROM generate_series(1, :n) AS g ORDER BY g
"""
PGBENCH_SCRIPT = """\\set id random(1, {rows})
BEGIN;
UPDATE bench_floor SET n = n + 1 WHERE id = :id;
INSERT INTO bench_floor_log (row_id) VALUES (:id);
COMMIT;
"""


def procrastinate_installed() -> bool:
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return False
    return True


def pgqueuer_installed() -> bool:
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        return False
    return True


def spawn_logged(
    args: list[str], env: dict[str, str], workers: int
) -> tuple[list[subprocess.Popen[bytes]], Path]:
    """``workers`` processes writing stdout and stderr to one temporary log file."""
    log = Path(tempfile.mkdtemp(prefix="outbox_bench_")) / "peer.log"
    with log.open("ab") as out:
        processes = [
            subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            for _ in range(workers)
        ]
    return processes, log


def wait_logged(
    count: Callable[[], int],
    target: int,
    what: str,
    processes: list[subprocess.Popen[bytes]],
    log: Path,
) -> None:
    """``wait_for_count``; on a failure, note the log's last lines. The log goes either way."""
    try:
        wait_for_count(count, target, what, processes)
    except Exception:
        tail = log.read_text(errors="replace").strip().splitlines()[-8:]
        note(f"{what}'s log ({log}), last lines:\n    " + "\n    ".join(tail))
        raise
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)


def run_procrastinate(messages: int, grouped: bool, workers: int, task: str) -> Measured | None:
    if not procrastinate_installed():
        return None
    import procrastinate

    url = create_database("postgresql", "procrastinate")
    engine = make_engine(url)
    try:
        schema_sql = Path(procrastinate.__file__).parent / "sql" / "schema.sql"
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(schema_sql.read_text())
            raw.commit()
        finally:
            raw.close()
        effect_metadata.create_all(engine)
        with engine.begin() as conn:
            params = {"n": messages, "grouped": grouped, "groups": GROUPS, "task": task}
            conn.execute(text(PG_PROCRASTINATE), params)
        analyze(engine, "postgresql", "procrastinate_jobs")
        env = python_env({"BENCH_PROCRASTINATE_DSN": libpq_dsn(url)})
        args = [sys.executable, "-m", "procrastinate", "--app", "bench.consumer_handlers.proc_app"]
        args += ["worker", "--queues", "bench", "--concurrency", "1"]
        started = time.perf_counter()
        processes, log = spawn_logged(args, env, workers)
        try:
            done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            count = partial(scalar, engine, done_sql)
            wait_logged(count, messages, "procrastinate", processes, log)
            wall = time.perf_counter() - started
        finally:
            stop_all(processes)
        span = scalar(
            engine,
            "SELECT EXTRACT(EPOCH FROM max(at) FILTER (WHERE type = 'succeeded')"
            " - min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events",
        )
        if task == "effect":
            check_effects(engine, messages, "procrastinate")
        return messages / float(span), wall
    finally:
        engine.dispose()
        drop_database("postgresql", url)


def run_pgqueuer(
    messages: int, workers: int, entrypoint: str, driver: str = "psycopg"
) -> Measured | None:
    """``driver`` psycopg (pgqueuer's ``PsycopgDriver``) or asyncpg (``AsyncpgDriver``)."""
    if not pgqueuer_installed():
        return None
    if importlib.util.find_spec(driver) is None:
        return None
    from bench.consumer_pgq import enqueue

    url = create_database("postgresql", "pgqueuer")
    engine = make_engine(url)
    dsn = libpq_dsn(url)
    try:
        install = [sys.executable, "-m", "pgqueuer", "--pg-dsn", dsn, "install"]
        subprocess.run(install, cwd=ROOT, env=python_env(), check=True, capture_output=True)
        effect_metadata.create_all(engine)
        asyncio.run(enqueue(dsn, entrypoint, messages))
        analyze(engine, "postgresql", "pgqueuer")
        env = python_env({"BENCH_PGQ_DSN": dsn, "BENCH_PGQ_DRIVER": driver})
        args = [sys.executable, "-m", "bench.consumer_pgq"]
        started = time.perf_counter()
        processes, log = spawn_logged(args, env, workers)
        try:
            done_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
            count = partial(scalar, engine, done_sql)
            wait_logged(count, messages, "pgqueuer", processes, log)
            wall = time.perf_counter() - started
        finally:
            stop_all(processes)
        span = scalar(
            engine,
            "SELECT EXTRACT(EPOCH FROM max(created) FILTER (WHERE status = 'successful')"
            " - min(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log",
        )
        if entrypoint == "effect":
            check_effects(engine, messages, "pgqueuer")
        return messages / float(span), wall
    finally:
        engine.dispose()
        drop_database("postgresql", url)


def check_effects(engine: Engine, messages: int, who: str) -> None:
    rows = scalar(engine, "SELECT count(*) FROM bench_effect")
    if rows != messages:
        note(f"!!! {who}: {rows} bench_effect rows for {messages} messages")


def pgbench_binary() -> str | None:
    candidate = Path("/usr/lib/postgresql/15/bin/pgbench")
    if candidate.exists():
        return str(candidate)
    return shutil.which("pgbench")


def pgbench_floor(seconds: float, clients: int, rows: int = 20_000) -> tuple[float, str] | None:
    """(tps, what ran) of the update + insert transaction, in a database of its own."""
    binary = pgbench_binary()
    if binary is None:
        return None
    url = create_database("postgresql", "pgbench")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE bench_floor (id int PRIMARY KEY, n int NOT NULL)"))
            conn.execute(
                text(
                    "CREATE TABLE bench_floor_log (id bigserial PRIMARY KEY, row_id int NOT NULL,"
                    " at timestamptz NOT NULL DEFAULT now())"
                )
            )
            conn.execute(
                text("INSERT INTO bench_floor SELECT g, 0 FROM generate_series(1, :n) AS g"),
                {"n": rows},
            )
        analyze(engine, "postgresql", "bench_floor")
        with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="outbox_bench_") as script:
            script.write(PGBENCH_SCRIPT.format(rows=rows))
            script.flush()
            args = [binary, "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients)]
            args += ["-T", str(max(1, round(seconds))), "-f", script.name]
            args += ["-h", "127.0.0.1", "-p", "5432", "-U", "postgres", str(url.database)]
            out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        found = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        if found is None:
            found = re.search(r"tps = ([\d.]+)", out)
        if found is None:
            raise RuntimeError(f"no tps in pgbench's output: {out[-500:]}")
        what = f"pgbench -M prepared -c {clients} -j {clients} -T {max(1, round(seconds))}"
        return float(found.group(1)), what
    finally:
        engine.dispose()
        drop_database("postgresql", url)
