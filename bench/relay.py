"""Relay throughput and latency (not a test): prints one table from one run.

    .venv/bin/python bench/relay.py [--rows 100000] [--latency-seconds 10] [--no-kafka]

1 KiB JSON payloads, persistent messages with publisher confirms (RabbitMQ) / acks=all and
idempotence (Kafka) on every line:
(a) raw publish rate with no database: pika waiting for each confirm (BlockingChannel
    confirm mode), pika with one confirm wait per 100 messages (our publisher, no database),
    confluent-kafka produce + flush;
(b) the database's own limit: the relay's fetch and mark-sent statements in a loop on psycopg,
    no broker (bench/relay_floor.py), with 1 and 2 connections;
    relay draining a backlog of --rows rows on PostgreSQL, 1 and 2 relay processes, with and
    without --pipeline, per broker; rate = rows / (last sent_at - first sent_at), so process
    start-up is not counted; each line's fraction of min(raw broker, raw database loop);
(c) commit -> broker-confirm latency (sent_at - the producer's commit time) at a steady
    500 messages/s, relay polling every 1 s, with LISTEN/NOTIFY and with polling only.
Goals: one relay >= 0.7x min(raw broker, raw database loop); two relays >= 1.6x one (Kafka);
with NOTIFY p50 <= 0.1 x poll.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika
from sqlalchemy import Engine, create_engine, func, select, text, update

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.relay_floor import raw_database_loop  # noqa: E402
from outbox import migrate, states  # noqa: E402
from outbox.dsn import make_engine  # noqa: E402
from outbox.schema import outbox_table  # noqa: E402
from outbox.store import Message, store, store_many  # noqa: E402
from outbox.transport import Outgoing  # noqa: E402
from outbox.wire import Envelope  # noqa: E402
from relay.publishers.rabbitmq import RabbitMQPublisher  # noqa: E402

PG_ADMIN = os.environ.get("OUTBOX_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
RABBIT = os.environ.get("OUTBOX_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
PAYLOAD = {"pad": "x" * 1000}  # ~1 KiB of JSON
BODY = '{"pad":"' + "x" * 1000 + '"}'
OUTBOX = str(Path(sys.executable).with_name("outbox"))
POLL = 1.0


def create_database() -> tuple[Engine, str, str]:
    name = f"outbox_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    engine = make_engine(url)
    migrate.upgrade(engine)
    return engine, url, name


def drop_database(name: str) -> None:
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def envelopes(queue: str, n: int) -> list[Outgoing]:
    now = datetime.now(UTC)
    return [
        Outgoing(i, Envelope(uuid.uuid4(), "bench", queue, 1, i, now, BODY))
        for i in range(1, n + 1)
    ]


def delete_rabbit(*names: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(RABBIT))
    ch = conn.channel()
    for name in names:
        ch.queue_delete(name)
    conn.close()


# -- (a) raw -----------------------------------------------------------------------------------


def raw_pika_per_message(n: int) -> float:
    queue = f"bench_raw_{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(RABBIT))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    props = pika.BasicProperties(content_type="application/json", delivery_mode=2)
    body = BODY.encode()
    started = time.perf_counter()
    for _ in range(n):
        ch.basic_publish("", queue, body, props, mandatory=True)
    elapsed = time.perf_counter() - started
    conn.close()
    delete_rabbit(queue)
    return n / elapsed


def raw_pika_batched(n: int, batch: int = 100) -> float:
    queue = f"bench_rawb_{uuid.uuid4().hex[:8]}"
    publisher = RabbitMQPublisher(RABBIT)
    publisher.connect()
    items = envelopes(queue, n)
    started = time.perf_counter()
    for i in range(0, n, batch):
        verdicts = publisher.publish(items[i : i + batch])
        assert all(v is None for v in verdicts.values())
    elapsed = time.perf_counter() - started
    publisher.close()
    delete_rabbit(f"{queue}_1")
    return n / elapsed


def raw_kafka(bootstrap: str, n: int) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    topic = f"bench_raw_{uuid.uuid4().hex[:8]}"
    producer.produce(topic, b"warm-up")  # topic auto-creation / metadata outside the timing
    producer.flush(30)
    errors: list[Any] = []
    body = BODY.encode()
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(
                    topic, body, key=str(i % 100), on_delivery=lambda e, _m: e and errors.append(e)
                )
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    assert not errors, errors[:3]
    return n / elapsed


# -- (b) drain -----------------------------------------------------------------------------------


def fill(engine: Engine, queue: str, rows: int) -> None:
    chunk = [Message(queue, "bench", PAYLOAD) for _ in range(1000)]
    for start in range(0, rows, 1000):
        with engine.begin() as conn:
            store_many(conn, chunk[: min(1000, rows - start)])


def reset(engine: Engine, queue: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(outbox_table)
            .where(outbox_table.c.queue == queue)
            .values(status=states.PENDING, sent_at=None)
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE outbox"))


def drain(
    engine: Engine, dsn: str, broker: str, relays: int, rows: int, batch: int, pipeline: bool
) -> float:
    cmd = [OUTBOX, "relay", "--dsn", dsn, "--broker", broker, "--stop-when-idle"]
    cmd += ["--batch-size", str(batch)]
    cmd.append("--pipeline" if pipeline else "--no-pipeline")
    cmd += ["--log-level", "WARNING"]
    procs = [subprocess.Popen(cmd) for _ in range(relays)]
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            sent = conn.execute(
                select(func.count()).where(outbox_table.c.status == states.SENT)
            ).scalar_one()
        if sent == rows:
            break
        if all(p.poll() is not None for p in procs):
            # the relays stopped (idle) before the end: start them again
            procs = [subprocess.Popen(cmd) for _ in range(relays)]
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    with engine.connect() as conn:
        first, last, sent = conn.execute(
            select(
                func.min(outbox_table.c.sent_at),
                func.max(outbox_table.c.sent_at),
                func.count(outbox_table.c.sent_at),
            )
        ).one()
    assert sent == rows, f"only {sent}/{rows} sent"
    return float(rows / (last - first).total_seconds())


# -- (c) latency ---------------------------------------------------------------------------------


def latency(
    engine: Engine, dsn: str, seconds: float, notify: bool, rate: float
) -> tuple[float, float, float]:
    queue = f"bench_lat_{uuid.uuid4().hex[:8]}"
    cmd = [OUTBOX, "relay", "--dsn", dsn, "--broker", RABBIT, "--queue", queue]
    cmd += ["--poll-interval", str(POLL), "--log-level", "WARNING"]
    if not notify:
        cmd.append("--no-notify")
    proc = subprocess.Popen(cmd)
    time.sleep(2.0)  # let it start and go idle: we measure a steady state
    committed: dict[uuid.UUID, datetime] = {}
    started = time.monotonic()
    n = 0
    while (elapsed := time.monotonic() - started) < seconds:
        if n < elapsed * rate:
            with engine.begin() as conn:
                event_id = store(conn, queue, "bench", PAYLOAD)
            committed[event_id] = datetime.now(UTC)
            n += 1
        else:
            time.sleep(0.0005)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            pending = conn.execute(
                select(func.count()).where(
                    outbox_table.c.queue == queue, outbox_table.c.status == states.PENDING
                )
            ).scalar_one()
        if pending == 0:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    with engine.connect() as conn:
        sent = dict(
            conn.execute(
                select(outbox_table.c.event_id, outbox_table.c.sent_at).where(
                    outbox_table.c.queue == queue
                )
            ).all()
        )
    lags = sorted((sent[e] - t).total_seconds() for e, t in committed.items())
    delete_rabbit(f"{queue}_1")
    p50 = statistics.median(lags)
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    return p50, p99, n / seconds


# -- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--no-kafka", action="store_true")
    parser.add_argument("--batch-size", type=int, default=100, help="relay and raw batch")
    args = parser.parse_args()
    rows: int = args.rows
    # As many messages as a drain publishes: a RabbitMQ queue 100,000 deep is slower to
    # fill than one 20,000 deep, and the drain's ratio must not be taken against the easier.
    raw_n = rows
    table: list[tuple[str, str, str]] = []

    print(f"(a) raw publish, {raw_n} messages ...", flush=True)
    per_msg = raw_pika_per_message(min(raw_n, 5000))
    batched = raw_pika_batched(raw_n, args.batch_size)
    table.append(("raw pika, wait per confirm (BlockingChannel)", f"{per_msg:,.0f} msg/s", ""))
    table.append(
        (f"raw pika, one confirm wait per {args.batch_size} msgs", f"{batched:,.0f} msg/s", "")
    )

    kafka = None
    if not args.no_kafka:
        try:
            import relay.publishers.kafka  # noqa: F401  (K's publisher: is it there?)
            from tests.support.kafka import KafkaBroker

            kafka = KafkaBroker(log_path=Path(tempfile.mkdtemp()) / "tansu.log")
            kafka.start()
            raw_k = raw_kafka(kafka.bootstrap, raw_n)
            table.append(("raw confluent-kafka, acks=all, idempotent", f"{raw_k:,.0f} msg/s", ""))
        except BaseException as exc:  # a missing broker or publisher skips the Kafka lines
            print(f"  kafka skipped: {exc!r}")
            kafka = None

    engine, dsn, name = create_database()
    try:
        queue = f"bench_{uuid.uuid4().hex[:8]}"
        print(f"(b) filling {rows} rows ...", flush=True)
        fill(engine, queue, rows)
        floors: dict[int, float] = {}
        for connections in (1, 2):
            reset(engine, queue)
            print(f"  raw database loop, {connections} connection(s) ...", flush=True)
            floors[connections] = raw_database_loop(engine, rows, args.batch_size, connections)
            table.append(
                (
                    f"raw database loop (fetch+mark, no broker), {connections} connection(s)",
                    f"{floors[connections]:,.0f} rows/s",
                    "",
                )
            )
        brokers = [("RabbitMQ", RABBIT, batched)]
        if kafka is not None:
            brokers.append(("Kafka", kafka.url, raw_k))
        for broker_name, url, raw in brokers:
            one: dict[bool, float] = {}
            for relays in (1, 2):
                for pipeline in (False, True):
                    reset(engine, queue)
                    mode = "--pipeline" if pipeline else "no pipeline"
                    print(f"  drain {broker_name}, {relays} relay(s), {mode} ...", flush=True)
                    rate = drain(engine, dsn, url, relays, rows, args.batch_size, pipeline)
                    if broker_name == "RabbitMQ":
                        delete_rabbit(f"{queue}_1")
                    limit = min(raw, floors[relays])
                    which = "raw broker" if raw <= floors[relays] else "raw db"
                    goal = f"{rate / limit:.2f}x min(raw) = {which}"
                    if relays == 1:
                        one[pipeline] = rate
                        goal += " (goal >= 0.7x)"
                    else:
                        goal += f"; {rate / one[pipeline]:.2f}x one relay (goal >= 1.6x)"
                    table.append(
                        (
                            f"relay drain {rows:,} rows, {broker_name}, {relays} relay(s), {mode}",
                            f"{rate:,.0f} msg/s",
                            goal,
                        )
                    )
        for rate in (500.0, 20.0):
            print(f"(c) latency at {rate:g} msg/s ...", flush=True)
            for notify in (True, False):
                p50, p99, achieved = latency(engine, dsn, args.latency_seconds, notify, rate)
                goal = f"p50 = {p50 / POLL:.3f}x poll (goal <= 0.1x)" if notify else ""
                mode = "NOTIFY" if notify else "polling only"
                table.append(
                    (
                        f"commit->confirm at {rate:g}/s (achieved {achieved:.0f}/s), {mode}",
                        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms",
                        goal,
                    )
                )
    finally:
        engine.dispose()
        drop_database(name)
        if kafka is not None:
            kafka.stop()

    width = max(len(r[0]) for r in table)
    print()
    print(f"{'measure':<{width}}  {'result':<28}  vs goal")
    print("-" * (width + 80))
    for what, result, goal in table:
        print(f"{what:<{width}}  {result:<28}  {goal}")


if __name__ == "__main__":
    main()
