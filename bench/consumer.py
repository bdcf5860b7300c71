"""The consumer side's benchmark (issue 4, item 8): one run, one table, ratios against goals.

    .venv/bin/python -m bench.consumer                          # a, b and c, full sizes
    .venv/bin/python -m bench.consumer --part a --history 200000
    .venv/bin/python -m bench.consumer --part b --messages 5000

(a) head of group: ``inbox.queries.waiting_heads`` against seed 000's variant B (its
    derived-table SQL ported to the inbox table) on PostgreSQL and MariaDB, 20,000 unfinished
    rows in 1,000 groups, then with ``--history`` finished rows added. Goals: >= 10x faster
    than B; with history <= 1.2x the time without. Both must name the same heads.
(b) no-op handlers, 2 ``outbox worker`` processes, database source on PostgreSQL, without
    groups and with 1,000 groups x 20 mixed priorities, next to procrastinate (2 worker
    processes, its ``lock`` for the groups) on the same server. Goal: >= 2x its jobs/s.
(c) commit -> handler-done latency at a steady rate through the database source.

Every part creates databases of its own (outbox_bench_consumer_*) and drops them.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.engine import URL, make_url

from bench.consumer_handlers import latency, latency_metadata
from inbox import queries as inbox_queries
from outbox import migrate, states
from outbox.dsn import make_engine
from outbox.schema import schema_for
from outbox.store import store

ROOT = Path(__file__).resolve().parents[1]
ADMIN = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/mysql",
}
CONSUMER = "bench"
GROUPS = 1000
UNFINISHED = 20_000

# --- (a) data: 20 rows per group, mixed priorities; a tenth of the groups has a processing
# row (not a head), some rows ready, the rest waiting. ids follow seq, as ingest gives them.
PG_UNFINISHED = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at)
SELECT gen_random_uuid(), :consumer, 'bench', 1 + (g * 7) % 9, 'group-' || (g % :groups),
       :base + g, 'noop', '{}'::jsonb, '{}'::jsonb,
       CASE WHEN g <= :groups AND g % 10 = 0 THEN 'processing'
            WHEN g % 7 = 0 THEN 'ready' ELSE 'waiting' END,
       0, 0, now(), now()
FROM generate_series(1, :n) AS g ORDER BY g
"""
PG_HISTORY = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at, finished_at)
SELECT gen_random_uuid(), :consumer, 'bench', 1 + (g * 7) % 9, 'group-' || (g % :groups),
       g, 'noop', '{}'::jsonb, '{}'::jsonb, 'done', 1, 0, now(), now(), now()
FROM generate_series(1, :n) AS g
"""
MARIADB_UNFINISHED = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at)
SELECT REPLACE(UUID(), '-', ''), :consumer, 'bench', 1 + (seq * 7) % 9,
       CONCAT('group-', seq % :groups), :base + seq, 'noop', '{}', '{}',
       CASE WHEN seq <= :groups AND seq % 10 = 0 THEN 'processing'
            WHEN seq % 7 = 0 THEN 'ready' ELSE 'waiting' END,
       0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM seq_1_to_{n} ORDER BY seq
"""
MARIADB_HISTORY = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at, finished_at)
SELECT REPLACE(UUID(), '-', ''), :consumer, 'bench', 1 + (seq * 7) % 9,
       CONCAT('group-', seq % :groups), seq, 'noop', '{}', '{}', 'done', 1, 0,
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM seq_1_to_{n}
"""
# Seed 000's variant B, ported: queue LIKE -> consumer, its job states -> the states that keep
# a place in the group order (on_retry="block"). The oldest row at the group's best priority.
VARIANT_B = """
SELECT MIN(t.id) AS id
FROM inbox t
INNER JOIN (
    SELECT serial_group, MIN(priority) AS min_priority
    FROM inbox
    WHERE consumer = :consumer AND state IN (:ready, :waiting, :retry)
    GROUP BY serial_group
) head ON head.serial_group = t.serial_group AND t.priority = head.min_priority
WHERE t.consumer = :consumer AND t.state IN (:ready, :waiting, :retry)
GROUP BY t.serial_group
ORDER BY id ASC
"""
B_PARAMS = {
    "consumer": CONSUMER,
    "ready": states.READY,
    "waiting": states.WAITING,
    "retry": states.RETRY,
}

# --- (b) the outbox rows the database source takes; (priority, group) as for procrastinate.
PG_OUTBOX = """
INSERT INTO outbox (event_id, queue, priority, serial_group, type, payload, headers,
                    occurred_at, available_at, status)
SELECT gen_random_uuid(), 'bench', 1 + (g * 7) % 9,
       CASE WHEN :grouped THEN 'group-' || (g % :groups) END, 'noop', '{}'::jsonb,
       '{}'::jsonb, now(), now() - interval '1 second', 'pending'
FROM generate_series(1, :n) AS g ORDER BY g
"""
# procrastinate: a larger number is more urgent; its lock serialises a group.
PG_PROCRASTINATE = """
INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, args)
SELECT 'bench', 'noop', -(1 + (g * 7) % 9),
       CASE WHEN :grouped THEN 'group-' || (g % :groups) END, jsonb_build_object('i', g)
FROM generate_series(1, :n) AS g ORDER BY g
"""


def create_database(dialect: str, tag: str) -> URL:
    name = f"outbox_bench_consumer_{tag}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(ADMIN[dialect], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if dialect == "postgresql":
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        else:
            conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    admin.dispose()
    return make_url(ADMIN[dialect]).set(database=name)


def drop_database(dialect: str, url: URL) -> None:
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
    else:
        with engine.begin() as conn:
            conn.execute(text(f"ANALYZE TABLE {table}"))


def dsn_of(url: URL) -> str:
    return url.render_as_string(hide_password=False)


Row = tuple[str, str, str, str]  # what, measured, goal, verdict


def note(message: str) -> None:
    print(f"  .. {message}", flush=True)


# --- (a) head of group ----------------------------------------------------------------------


def fill_inbox(engine: Engine, dialect: str, history: bool, rows: int) -> None:
    params = {"consumer": CONSUMER, "groups": GROUPS}
    with engine.begin() as conn:
        if history:
            sql = PG_HISTORY if dialect == "postgresql" else MARIADB_HISTORY
            conn.execute(text(sql.replace("{n}", str(rows))), {**params, "n": rows})
        else:
            sql = PG_UNFINISHED if dialect == "postgresql" else MARIADB_UNFINISHED
            # seq above any history row's: history is older than the work in line.
            args = {**params, "n": UNFINISHED, "base": 10_000_000}
            conn.execute(text(sql.replace("{n}", str(UNFINISHED))), args)
    analyze(engine, dialect, "inbox")


def heads_ours(engine: Engine) -> list[int]:
    stmt = inbox_queries.waiting_heads(
        schema_for().inbox, CONSUMER, datetime.now(UTC), skip_retry=False
    )
    with engine.connect() as conn:
        return [int(r.id) for r in conn.execute(stmt)]


def heads_b(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return [int(r.id) for r in conn.execute(text(VARIANT_B), B_PARAMS)]


def expected_from_b(engine: Engine, b_ids: Sequence[int]) -> set[int]:
    """Variant B names every group's head; ours only the waiting ones of idle groups."""
    inbox = schema_for().inbox
    with engine.connect() as conn:
        rows = conn.execute(
            select(inbox.c.id, inbox.c.serial_group, inbox.c.state).where(
                inbox.c.state.in_(states.INBOX_UNFINISHED_STATES)
            )
        ).all()
    busy = {r.serial_group for r in rows if r.state in (states.PROCESSING, states.HALTED)}
    state_of = {int(r.id): (r.serial_group, r.state) for r in rows}
    return {i for i in b_ids if state_of[i][1] == states.WAITING and state_of[i][0] not in busy}


def timed_median(fns: Sequence[Callable[[], Any]], runs: int) -> list[float]:
    """Interleaved runs (ours, B, ours, B, ...) after one warm-up each; medians in ms."""
    for fn in fns:
        fn()
    timings: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for index, fn in enumerate(fns):
            started = time.perf_counter()
            fn()
            timings[index].append(time.perf_counter() - started)
    return [statistics.median(t) * 1000 for t in timings]


def part_a(dialect: str, history_rows: int, runs: int) -> list[Row]:
    url = create_database(dialect, "a")
    engine = make_engine(url)
    rows: list[Row] = []
    try:
        migrate.upgrade(engine)
        fill_inbox(engine, dialect, history=False, rows=0)
        results: dict[str, list[float]] = {}
        for stage in ("empty", "history"):
            if stage == "history":
                started = time.perf_counter()
                fill_inbox(engine, dialect, history=True, rows=history_rows)
                note(
                    f"{dialect}: {history_rows:,} done rows in {time.perf_counter() - started:.0f}s"
                )
            ours, b = heads_ours(engine), heads_b(engine)
            expected = expected_from_b(engine, b)
            if set(ours) != expected:
                print(
                    f"!!! MISMATCH {dialect} {stage}: ours {len(ours)} heads, variant B "
                    f"(filtered) {len(expected)}; only ours {sorted(set(ours) - expected)[:5]},"
                    f" only B {sorted(expected - set(ours))[:5]}",
                    flush=True,
                )
            results[stage] = timed_median(
                (lambda: heads_ours(engine), lambda: heads_b(engine)), runs
            )
            note(f"{dialect} {stage}: {len(ours)} heads; ours/B ms = {results[stage]}")
        for stage, label in (("empty", "20k unfinished"), ("history", f"+{history_rows:,} done")):
            ours_ms, b_ms = results[stage]
            speedup = b_ms / ours_ms
            rows.append(
                (
                    f"(a) {dialect} heads, {label}",
                    f"ours {ours_ms:.1f} ms, B {b_ms:.1f} ms: {speedup:.2f}x",
                    ">= 10x faster than B",
                    verdict(speedup >= 10, f"{speedup / 10:.2f} of goal"),
                )
            )
        growth = results["history"][0] / results["empty"][0]
        rows.append(
            (
                f"(a) {dialect} ours with/without history",
                f"{growth:.2f}x (B {results['history'][1] / results['empty'][1]:.2f}x)",
                "<= 1.2x",
                verdict(growth <= 1.2, f"{growth:.2f}x"),
            )
        )
    finally:
        engine.dispose()
        drop_database(dialect, url)
    return rows


def verdict(ok: bool, detail: str) -> str:
    return "MET" if ok else f"missed ({detail})"


# --- (b) throughput -------------------------------------------------------------------------


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return env


def spawn_ours(
    dsn: str, extra: Sequence[str] = (), idle: bool = True, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "outbox.cli", "worker", "bench.consumer_handlers:consumer"]
    args += ["--dsn", dsn, "--log-level", "WARNING", "--time-limit", "900", *extra]
    if idle:
        args.append("--stop-when-idle")
    return subprocess.Popen(args, cwd=ROOT, env={**python_env(), **(env or {})})


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


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


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def run_ours(messages: int, grouped: bool, workers: int) -> tuple[float, float]:
    """(jobs/s over first ingest -> last done, wall seconds incl. start-up)."""
    url = create_database("postgresql", "b")
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            params = {"n": messages, "grouped": grouped, "groups": GROUPS}
            conn.execute(text(PG_OUTBOX), params)
        analyze(engine, "postgresql", "outbox")
        started = time.perf_counter()
        processes = [spawn_ours(dsn_of(url), ["--poll-interval", "0.1"]) for _ in range(workers)]
        try:
            done_sql = "SELECT count(*) FROM inbox WHERE state = 'done'"
            wait_until(lambda: scalar(engine, done_sql) >= messages, 900, "our workers")
            wall = time.perf_counter() - started
        finally:
            stop_all(processes)
        span = scalar(
            engine,
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(received_at)) FROM inbox",
        )
        bad = scalar(engine, "SELECT count(*) FROM inbox WHERE state <> 'done'")
        if bad:
            print(f"!!! {bad} inbox rows not done", flush=True)
        return messages / float(span), wall
    finally:
        engine.dispose()
        drop_database("postgresql", url)


def run_procrastinate(messages: int, grouped: bool, workers: int) -> tuple[float, float] | None:
    try:
        import procrastinate
    except ImportError:
        return None
    url = create_database("postgresql", "proc")
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
        with engine.begin() as conn:
            conn.execute(
                text(PG_PROCRASTINATE), {"n": messages, "grouped": grouped, "groups": GROUPS}
            )
        analyze(engine, "postgresql", "procrastinate_jobs")
        env = python_env()
        env["BENCH_PROCRASTINATE_DSN"] = dsn_of(url.set(drivername="postgresql"))
        args = [sys.executable, "-m", "procrastinate", "--app", "bench.consumer_handlers.proc_app"]
        args += ["worker", "--queues", "bench", "--concurrency", "1"]
        started = time.perf_counter()
        processes = [
            subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
            for _ in range(workers)
        ]
        try:
            done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            wait_until(lambda: scalar(engine, done_sql) >= messages, 900, "procrastinate")
            wall = time.perf_counter() - started
        finally:
            stop_all(processes)
        span = scalar(
            engine,
            "SELECT EXTRACT(EPOCH FROM max(at) FILTER (WHERE type = 'succeeded')"
            " - min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events",
        )
        return messages / float(span), wall
    finally:
        engine.dispose()
        drop_database("postgresql", url)


def part_b(messages: int, workers: int) -> list[Row]:
    rows: list[Row] = []
    for grouped in (False, True):
        label = f"{GROUPS:,} groups x {messages // GROUPS} prio mixed" if grouped else "no groups"
        ours, ours_wall = run_ours(messages, grouped, workers)
        note(f"ours {label}: {ours:.0f} jobs/s, wall {ours_wall:.1f}s")
        theirs = run_procrastinate(messages, grouped, workers)
        if theirs is None:
            measured = f"ours {ours:.0f} jobs/s, procrastinate n/a"
            rows.append((f"(b) {messages:,} no-op, {label}", measured, ">= 2x procr.", "n/a"))
            continue
        note(f"procrastinate {label}: {theirs[0]:.0f} jobs/s, wall {theirs[1]:.1f}s")
        ratio = ours / theirs[0]
        rows.append(
            (
                f"(b) {messages:,} no-op, {label}",
                f"ours {ours:.0f} jobs/s, procrastinate {theirs[0]:.0f}: {ratio:.2f}x",
                ">= 2x procrastinate",
                verdict(ratio >= 2, f"{ratio / 2:.2f} of goal"),
            )
        )
    return rows


# --- (c) latency ----------------------------------------------------------------------------


AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"


def measure_latency(
    url: URL, queue: str, rate: float, seconds: float, workers: int, broker: str | None
) -> tuple[float, float, float, int]:
    """Workers (and a relay with a broker) running; store ``rate`` messages/s, one commit
    each; latency = the handler's wall time - the producer's time right after its commit."""
    engine = make_engine(url)
    env = {"BENCH_QUEUE": queue}
    extra = ["--source", broker] if broker else []
    processes = [spawn_ours(dsn_of(url), extra, idle=False, env=env) for _ in range(workers)]
    if broker:
        relay = [sys.executable, "-m", "outbox.cli", "relay", "--dsn", dsn_of(url)]
        relay += ["--broker", broker, "--queue", queue, "--log-level", "WARNING"]
        processes.append(subprocess.Popen(relay, cwd=ROOT, env=python_env()))
    try:
        listening = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
        )
        wait_until(lambda: scalar(engine, listening) >= workers, 60, "listeners")
        if broker:  # the sources declare their queues at start: let them connect first
            with engine.begin() as conn:
                store(conn, queue, "timed", {"warm": True})
            count_sql = "SELECT count(*) FROM bench_latency"
            wait_until(lambda: scalar(engine, count_sql) >= 1, 60, "a first message")
            with engine.begin() as conn:
                conn.execute(latency.delete())
        total = int(rate * seconds)
        committed: dict[uuid.UUID, float] = {}
        started = time.perf_counter()
        # One producer cannot commit 200 times a second on a busy 2-core box: several
        # threads, each on its own connection, each paced to its share of the rate.
        producers = [
            threading.Thread(
                target=produce,
                args=(engine, queue, range(i, total, PRODUCERS), rate, started, committed),
            )
            for i in range(PRODUCERS)
        ]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join()
        achieved = total / (time.perf_counter() - started)
        count_sql = "SELECT count(*) FROM bench_latency"
        wait_until(lambda: scalar(engine, count_sql) >= total, 120, "latency handlers")
    finally:
        stop_all(processes)
    with engine.connect() as conn:
        done = dict(conn.execute(select(latency.c.event_id, latency.c.done_at)).all())
    engine.dispose()
    lat = sorted((done[e] - t) * 1000 for e, t in committed.items())
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return lat[len(lat) // 2], p99, achieved, total


PRODUCERS = 4


def produce(
    engine: Engine,
    queue: str,
    indexes: range,
    rate: float,
    started: float,
    committed: dict[uuid.UUID, float],
) -> None:
    """Message i is due at started + i / rate; one transaction (one commit) per message."""
    for i in indexes:
        pause = started + i / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        with engine.begin() as conn:
            event_id = store(conn, queue, "timed", {"i": i})
        committed[event_id] = time.time()


def delete_rabbit_queues(queue: str) -> None:
    try:
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(AMQP))
        channel = connection.channel()
        for priority in range(1, 10):
            channel.queue_delete(f"{queue}_{priority}")
        connection.close()
    except Exception as exc:  # cleanup only: say so, do not hide the table
        note(f"could not delete RabbitMQ queues {queue}_*: {exc}")


def part_c(rates: Sequence[float], seconds: float, workers: int, rabbit: bool) -> list[Row]:
    rows: list[Row] = []
    cases = [(r, label, b) for label, b in (("database", None), ("RabbitMQ", AMQP)) for r in rates]
    for rate, label, broker in cases:
        what = f"(c) commit->done, {label} source, {rate:.0f}/s"
        if broker and not rabbit:
            rows.append((what, "n/a", "(report)", "skipped (--no-rabbit)"))
            continue
        url = create_database("postgresql", "c")
        queue = f"benchc{uuid.uuid4().hex[:8]}"
        try:
            engine = make_engine(url)
            migrate.upgrade(engine)
            latency_metadata.create_all(engine)
            engine.dispose()
            p50, p99, achieved, total = measure_latency(url, queue, rate, seconds, workers, broker)
            measured = f"p50 {p50:.1f} ms, p99 {p99:.1f} ms ({achieved:.0f} msg/s, n={total})"
            rows.append((what, measured, "(report)", "-"))
        except Exception as exc:
            rows.append((what, "n/a", "(report)", f"failed: {exc}"))
        finally:
            drop_database("postgresql", url)
            if broker:
                delete_rabbit_queues(queue)
    return rows


def print_table(rows: Sequence[Row], command: str) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    header = ("measurement", "result", "goal", "verdict")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    print(f"\n$ {command}")
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("a", "b", "c", "all"), default="all")
    parser.add_argument("--messages", type=int, default=20_000, help="(b) messages per case")
    parser.add_argument("--history", type=int, default=1_000_000, help="(a) done rows added")
    parser.add_argument("--runs", type=int, default=7, help="(a) timed runs per query")
    parser.add_argument("--workers", type=int, default=2, help="(b, c) worker processes")
    parser.add_argument(
        "--rates", default="200,40", help="(c) messages per second, comma-separated"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="(c) how long per rate")
    parser.add_argument("--no-rabbit", action="store_true", help="(c) database source only")
    parser.add_argument("--dialects", default="postgresql,mariadb", help="(a) databases")
    args = parser.parse_args()
    rows: list[Row] = []
    if args.part in ("a", "all"):
        for dialect in args.dialects.split(","):
            rows += part_a(dialect, args.history, args.runs)
    if args.part in ("b", "all"):
        rows += part_b(args.messages, args.workers)
    if args.part in ("c", "all"):
        rates = [float(r) for r in args.rates.split(",")]
        rows += part_c(rates, args.seconds, args.workers, not args.no_rabbit)
    print_table(rows, " ".join(["python -m bench.consumer", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
