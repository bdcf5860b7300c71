"""Soak (not in CI): a steady load with relay and worker kills and one broker
restart, then totals read back from the database.

    .venv/bin/python bench/soak.py --duration 2m                      # PostgreSQL + RabbitMQ
    .venv/bin/python bench/soak.py --duration 2m --broker kafka://    # + a tansu it starts
    .venv/bin/python bench/soak.py --broker kafka://host:9092 --broker-restart-at none

A producer thread stores --rate messages/s with ``outbox.store`` (1-4 per transaction, mixed
priorities 1-3, --groups serial groups and some ungrouped messages; every 50th transaction is
rolled back, every --fail-every-th message is poison: its handler fails permanently).
--relays ``outbox relay`` and --workers ``outbox worker bench.soak_consumer:consumer
--source BROKER`` processes run throughout; every --kill-every one of them (relays and
workers in turn) is SIGKILLed and started again at once, as supervisord would.

Broker restart at --broker-restart-at (default half-time), down for --outage seconds: every
client reaches the broker through a TCP proxy owned by this script, and the restart closes
every connection and refuses new ones (restarting the machine's RabbitMQ would disturb its
other users). --real-restart: RabbitMQ ``rabbitmqctl stop_app``/``start_app``; with a tansu
started here (``--broker kafka://``), SIGKILL and start it again: tansu keeps everything in
memory, so messages it held and had not delivered are gone (reported as such, and lost).

After --duration: stop producing, wait for the drain (--drain-timeout), stop the processes
(SIGTERM) and print the totals. Exit 1 when any guarantee was broken: lost (stored without a
done/failed inbox row), double effects, effects that do not match done, serial group runs that
overlapped, rolled-back messages that exist, failures of messages that were not poison.
--dsn defaults to a fresh PostgreSQL database created here and dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.soak_consumer import effects_metadata  # noqa: E402
from bench.soak_procs import OUTBOX, Fleet, Tansu, free_port, rabbitmqctl  # noqa: E402
from bench.soak_producer import Producer  # noqa: E402
from bench.soak_proxy import Proxy  # noqa: E402
from bench.soak_report import print_totals  # noqa: E402
from bench.soak_stats import Probe, Snapshot, Totals, totals  # noqa: E402
from outbox import migrate  # noqa: E402
from outbox.dsn import make_engine, mask  # noqa: E402

PG_ADMIN = os.environ.get("OUTBOX_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
AMQP = os.environ.get("OUTBOX_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")


def seconds(value: str) -> float:
    """'90', '90s', '10m', '1h', '2m30s' -> seconds."""
    parts = re.fullmatch(
        r"\s*(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?\s*", value
    )
    if not value.strip() or parts is None:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (e.g. 90s, 10m, 1h)")
    h, m, s = (float(p) if p else 0.0 for p in parts.groups())
    return h * 3600 + m * 60 + s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Totals and verdicts come from what the database recorded.",
    )
    p.add_argument("--dsn", help="database URL (default: a fresh PostgreSQL database, dropped)")
    p.add_argument("--keep-db", action="store_true", help="do not drop the database created")
    p.add_argument(
        "--broker",
        default=AMQP,
        help="amqp://user:pass@host:port/vhost, kafka://host:port, or kafka:// to start a tansu "
        "broker here (default: " + mask(AMQP).replace("%", "%%") + ")",
    )
    p.add_argument("--duration", type=seconds, default="10m", help="load duration (default 10m)")
    p.add_argument("--rate", type=float, default=100.0, help="messages/s (default 100)")
    p.add_argument("--relays", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=2, help="handler threads per worker")
    p.add_argument("--groups", type=int, default=100, help="serial groups (default 100)")
    p.add_argument(
        "--fail-every", type=int, default=1000, help="every Nth message is poison (0: none)"
    )
    p.add_argument("--handler-ms", type=float, default=5.0, help="time a handler takes")
    p.add_argument("--visibility-timeout", type=float, default=10.0, help="of the consumer (s)")
    p.add_argument("--kill-every", type=seconds, default="20s", help="0: no kills (default 20s)")
    p.add_argument(
        "--broker-restart-at",
        default="",
        help="when in the run (e.g. 60s; default half-time; 'none': no restart)",
    )
    p.add_argument("--outage", type=seconds, default="10s", help="broker down this long")
    p.add_argument("--real-restart", action="store_true", help="really stop the broker (above)")
    p.add_argument("--progress-every", type=seconds, default="10s")
    p.add_argument("--drain-timeout", type=seconds, default="120s")
    p.add_argument("--seed", type=int, default=None, help="random seed (kills, message mix)")
    args = p.parse_args(argv)
    if args.relays < 1 or args.workers < 1 or args.rate <= 0 or args.groups < 1:
        p.error("--relays, --workers, --groups must be >= 1 and --rate > 0")
    if args.broker_restart_at.strip().lower() == "none":
        args.restart_at = None
    else:
        text_at = args.broker_restart_at.strip()
        args.restart_at = seconds(text_at) if text_at else args.duration / 2
    return args


class Broker:
    """The broker as the processes see it: through our proxy, with an outage to inflict."""

    def __init__(self, url: str, real: bool, log_dir: Path) -> None:
        self.real = real
        self.tansu: Tansu | None = None
        self.proxy: Proxy | None = None
        self.dropped = 0
        scheme = url.split("://", 1)[0].lower()
        self.kind = "kafka" if scheme == "kafka" else "amqp"
        if self.kind == "kafka" and not url.split("://", 1)[1].strip("/"):
            port = free_port()
            self.tansu = Tansu(log_dir / "tansu.log", advertised=port)
            self.tansu.start()
            self.proxy = Proxy("127.0.0.1", self.tansu.port, port)
            self.proxy.start()
            self.direct = f"kafka://127.0.0.1:{self.tansu.port}"
            self.url = f"kafka://127.0.0.1:{port}"
        elif self.kind == "kafka":
            # A Kafka client reconnects to the advertised listeners, not to the address it
            # was given: a proxy we cannot advertise would be bypassed. No restart then.
            self.direct = self.url = url
        else:
            parts = urlsplit(url)
            self.proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5672)
            self.proxy.start()
            userinfo = parts.netloc.rpartition("@")[0]
            netloc = (
                f"{userinfo}@127.0.0.1:{self.proxy.port}"
                if userinfo
                else f"127.0.0.1:{self.proxy.port}"
            )
            self.direct = url
            self.url = urlunsplit(parts._replace(netloc=netloc))

    @property
    def can_restart(self) -> bool:
        return self.proxy is not None

    def describe(self) -> str:
        if self.real:
            how = "tansu SIGKILL + start" if self.tansu else "rabbitmqctl stop_app/start_app"
        else:
            how = "proxy cut: connections dropped, new ones refused"
        return how

    def down(self) -> None:
        if self.real and self.tansu is not None:
            self.tansu.kill()
        elif self.real:
            rabbitmqctl("stop_app")
        elif self.proxy is not None:
            self.dropped += self.proxy.cut()

    def up(self) -> None:
        if self.real and self.tansu is not None:
            self.tansu.start()
        elif self.real:
            rabbitmqctl("start_app")
        elif self.proxy is not None:
            self.proxy.resume()

    def close(self, queue: str) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.tansu is not None:
            self.tansu.stop()
        if self.kind == "amqp":
            delete_rabbit_queues(self.direct, queue)


def delete_rabbit_queues(url: str, queue: str) -> None:
    """RabbitMQ queues outlive the database: delete the run's <queue>_1..9."""
    try:
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        for priority in range(1, 10):
            channel.queue_delete(f"{queue}_{priority}")
        connection.close()
    except Exception as exc:  # cleanup only: say so, keep the totals
        print(f"could not delete RabbitMQ queues {queue}_*: {exc}", flush=True)


def create_database() -> str:
    name = f"outbox_soak_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)


def drop_database(dsn: str) -> None:
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(dsn).database}" WITH (FORCE)'))
    admin.dispose()


def start_fleet(
    args: argparse.Namespace, dsn: str, broker: Broker, queue: str, logs: Path
) -> Fleet:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ROOT),
        SOAK_QUEUE=queue,
        SOAK_HANDLER_MS=str(args.handler_ms),
        SOAK_VISIBILITY_TIMEOUT=str(args.visibility_timeout),
    )
    fleet = Fleet()
    if args.seed is not None:
        fleet.rng.seed(args.seed)
    common = ["--dsn", dsn, "--log-level", "WARNING"]
    for i in range(args.relays):
        relay = [*OUTBOX, "relay", *common, "--broker", broker.url, "--queue", queue]
        fleet.add(f"relay{i}", relay, env, logs)
    for i in range(args.workers):
        worker = [*OUTBOX, "worker", "bench.soak_consumer:consumer", *common]
        worker += ["--source", broker.url, "--concurrency", str(args.concurrency)]
        worker += ["--poll-interval", "0.5"]
        fleet.add(f"worker{i}", worker, env, logs)
    return fleet


def progress(elapsed: float, snap: Snapshot | None, fleet: Fleet, note: str = "") -> None:
    if snap is None:
        print(f"[{elapsed:6.0f}s] (no snapshot: database unavailable)  {note}", flush=True)
        return
    print(
        f"[{elapsed:6.0f}s] stored {snap.stored:7d}  sent {snap.sent:7d}  done {snap.done:7d}"
        f"  failed {snap.failed:4d}  pending {snap.unfinished:6d}  lag {snap.lag:6.1f}s"
        f"  kills {fleet.kills():3d} (relay {fleet.kills('relay')}, worker {fleet.kills('worker')})"
        + (f"  {note}" if note else ""),
        flush=True,
    )


def every(period: float, start: float) -> Callable[[float], bool]:
    """A schedule: returns True once each time ``now`` passes the next multiple of period."""
    state = {"next": start + period}

    def due(now: float) -> bool:
        if period <= 0 or now < state["next"]:
            return False
        state["next"] += period * (1 + int((now - state["next"]) // period))
        return True

    return due


def with_retries(read: Callable[[], Totals], timeout: float = 120.0) -> Totals:
    """The totals, retried while the database is unavailable (up to ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except DBAPIError as exc:
            if time.monotonic() > deadline:
                raise
            print(f"totals: database unavailable, retrying: {str(exc.orig or exc)[:120]}")
            time.sleep(2.0)


def run(args: argparse.Namespace) -> int:
    logs = Path(tempfile.mkdtemp(prefix="outbox_soak_"))
    queue = f"soak_{uuid.uuid4().hex[:8]}"
    created = args.dsn is None
    dsn = create_database() if created else args.dsn
    engine: Engine = make_engine(dsn, pool_pre_ping=True)  # survives a database restart
    broker: Broker | None = None
    fleet: Fleet | None = None
    producer: Producer | None = None
    stopped = False
    try:
        migrate.upgrade(engine)
        effects_metadata.create_all(engine)
        broker = Broker(args.broker, args.real_restart, logs)
        restart_at = args.restart_at if broker.can_restart else None
        print(
            f"soak: {mask(dsn)}  broker {mask(broker.direct)}  queue {queue}  logs {logs}\n"
            f"      {args.duration:.0f}s at {args.rate:g}/s, {args.relays} relays, {args.workers}"
            f" workers x {args.concurrency}, {args.groups} groups, kill every {args.kill_every:g}s,"
            f" broker restart "
            + (
                f"at {restart_at:.0f}s for {args.outage:g}s ({broker.describe()})"
                if restart_at is not None
                else "none"
            ),
            flush=True,
        )
        if args.restart_at is not None and restart_at is None:
            print("      no broker restart: a Kafka client follows the broker's advertised")
            print("      address, so a proxy cannot stand in front of a broker we did not start")
        fleet = start_fleet(args, dsn, broker, queue, logs)
        probe = Probe(engine, queue)
        producer = Producer(engine, queue, args.rate, args.groups, args.fail_every, args.seed)
        t0 = time.monotonic()
        producer.start()
        kill_due, progress_due = every(args.kill_every, t0), every(args.progress_every, t0)
        outage: tuple[float, float] | None = None  # wall-clock (down, up) of the restart
        down_since: float | None = None
        while (now := time.monotonic()) - t0 < args.duration:
            notes = [f"revived {n}" for n in fleet.revive()]
            if kill_due(now):
                notes.append(f"killed {fleet.kill_one()}")
            if (
                restart_at is not None
                and down_since is None
                and outage is None
                and now - t0 >= restart_at
            ):
                broker.down()
                down_since, notes = now, [*notes, "BROKER DOWN"]
                outage = (time.time(), 0.0)
            if down_since is not None and outage is not None and now - down_since >= args.outage:
                broker.up()
                down_since, outage = None, (outage[0], time.time())
                notes.append("broker up")
            if progress_due(now) or notes:
                progress(now - t0, probe.try_snapshot(), fleet, ", ".join(notes))
            time.sleep(0.2)  # the schedule's tick (pacing, not synchronisation)
        if down_since is not None and outage is not None:  # the run ended mid-outage
            broker.up()
            outage = (outage[0], time.time())
            print("broker up (end of load)", flush=True)
        producer.stop()
        print(
            f"load over: {producer.stored} stored, draining (up to {args.drain_timeout:g}s)",
            flush=True,
        )
        deadline = time.monotonic() + args.drain_timeout
        snap: Snapshot | None = None
        drain_due = every(args.progress_every, time.monotonic())
        while time.monotonic() < deadline:
            snap = probe.try_snapshot()
            if snap is not None and snap.unfinished == 0:
                break
            fleet.revive()
            if drain_due(time.monotonic()):
                progress(time.monotonic() - t0, snap, fleet, "draining")
            time.sleep(0.5)
        progress(
            time.monotonic() - t0,
            snap,
            fleet,
            "drained" if snap is not None and snap.unfinished == 0 else "DRAIN TIMEOUT",
        )
        codes = fleet.stop()
        stopped = True
        result = with_retries(lambda: totals(engine, queue, producer.poison, producer.rolled_back))
        return print_totals(args, broker, result, probe, fleet, codes, producer, outage)
    finally:
        # each step on its own: a failing one must not leave processes or a database behind
        steps: list[Callable[[], object]] = []
        if producer is not None:
            steps.append(producer.stop)
        if fleet is not None and not stopped:
            steps.append(lambda: fleet.stop(timeout=10) if fleet else None)
        if broker is not None:
            steps.append(lambda: broker.close(queue) if broker else None)
        steps.append(engine.dispose)
        if created and not args.keep_db:
            steps.append(lambda: drop_database(dsn))
        for step in steps:
            try:
                step()
            except Exception as exc:
                print(f"cleanup: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def main() -> None:
    sys.exit(run(parse_args()))


if __name__ == "__main__":
    main()
