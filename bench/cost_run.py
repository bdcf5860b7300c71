"""One cell of ``bench/cost.py``: a database of its own, ``backlog`` no-op messages stored up
front, analyzed; counters read; the processes started; the drain timed up to the last message
done; the processes stopped; counters read again; the database (and broker queues) dropped.

Paths: ``db``, ``--workers`` ``outbox worker --stop-when-idle`` processes reading the
database; ``rabbitmq``/``kafka``, one ``outbox relay --stop-when-idle`` publishing the stored
rows and ``--workers`` workers reading that broker (stopped by SIGTERM once all are done).
Kafka is an in-memory tansu broker started for the cell (its topics go with it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy.engine import URL

from bench import consumer_support as support
from bench.consumer_brokers import Tansu, bench_queue, delete_rabbit_queues
from bench.consumer_support import note
from bench.cost_counters import Counters, Reader, Statement, counters_for
from bench.cost_probe import Children, Sampler, Usage, add_usage, pids_of, total_cpu
from outbox import migrate
from outbox.dsn import make_engine

PREFIX = "outbox_bench_cost"
POLL_SECONDS = 0.5  # at least; a slow count is read less often (10x its own time)


@dataclass(frozen=True)
class Spec:
    dialect: str
    path: str
    backlog: int
    workers: int
    autovacuum: str  # "on", "off", or "-" (not PostgreSQL)
    hold: bool = False
    windows: float | None = None
    keep: bool = False


@dataclass
class Window:
    start: float
    end: float
    rate: float  # msg/s
    scanned: float | None  # rows scanned per message done


@dataclass
class Cell:
    spec: Spec
    wall: float = 0.0  # processes started -> last message done
    span: float = 0.0  # first message taken -> last handler done (no start-up)
    cpu: dict[str, float] = field(default_factory=dict)  # seconds, by role
    usage: Usage = field(default_factory=dict)  # counter deltas
    statement_wal: float | None = None
    top: list[Statement] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    error: str | None = None

    def per_message(self, value: float) -> float:
        return value / self.spec.backlog


class Broker:
    """The cell's broker: nothing (db), RabbitMQ (the server's), tansu (started here)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tansu = Tansu() if path == "kafka" else None

    @property
    def url(self) -> str:
        return self.tansu.url if self.tansu is not None else support.AMQP

    def start(self) -> None:
        if self.tansu is not None:
            self.tansu.start()

    def cpu(self) -> float:
        """CPU seconds of the broker's processes (RabbitMQ's: whoever else uses it too)."""
        if self.path == "rabbitmq":
            return total_cpu(pids_of("beam.smp"))
        if self.tansu is not None and self.tansu.process is not None:
            return total_cpu([self.tansu.process.pid])
        return 0.0

    def stop(self, queue: str, keep: bool) -> None:
        if self.tansu is not None:
            self.tansu.stop()
        elif self.path == "rabbitmq" and not keep:
            delete_rabbit_queues(queue)


class Progress:
    """The done count for ``wait_for_count``, read at most every ``interval`` seconds, and
    the ``--windows`` samples; fails when every process has exited before the end."""

    def __init__(
        self, spec: Spec, reader: Reader, counters: Counters, children: Children, started: float
    ) -> None:
        self.spec, self.reader, self.counters, self.children = spec, reader, counters, children
        self.started, self.at, self.done = started, 0.0, 0
        self.interval = POLL_SECONDS
        self.samples: list[tuple[float, int, float | None]] = [(0.0, 0, self._scanned())]

    def _scanned(self) -> float | None:
        """Rows scanned so far, less those of the done count's own queries."""
        scanned = self.counters.scanned()
        return None if scanned is None else scanned - self.reader.own_scanned()

    def count(self) -> int:
        exited = self.children.all_exited()
        if exited or time.monotonic() - self.at >= self.interval:
            began = time.monotonic()
            self.done = self.reader.count()
            self.at = time.monotonic()
            self.interval = max(POLL_SECONDS, 10 * (self.at - began))
            if self.spec.windows:
                self.interval = min(self.interval, self.spec.windows / 2)
                elapsed = time.perf_counter() - self.started
                self.samples.append((elapsed, self.done, self._scanned()))
        if exited and self.done < self.spec.backlog:
            codes = self.children.exit_codes()
            raise RuntimeError(f"every process exited ({codes}) at {self.done}/{self.spec.backlog}")
        return self.done

    def windows(self) -> list[Window]:
        if not self.spec.windows:
            return []
        found: list[Window] = []
        first = self.samples[0]
        for sample in self.samples[1:]:
            seconds = sample[0] - first[0]
            if seconds <= 0 or (seconds < self.spec.windows and sample is not self.samples[-1]):
                continue
            done = sample[1] - first[1]
            scanned = None
            if done and sample[2] is not None and first[2] is not None:
                scanned = (sample[2] - first[2]) / done
            found.append(Window(first[0], sample[0], done / seconds, scanned))
            first = sample
        return found


def run_cell(spec: Spec) -> Cell:
    cell = Cell(spec)
    label = f"{spec.dialect} {spec.path} {spec.backlog:,} autovacuum {spec.autovacuum}"
    note(f"{label}: storing")
    url = support.create_database(spec.dialect, spec.path, prefix=PREFIX)
    queue = bench_queue("cost")
    broker = Broker(spec.path)
    counters: Counters | None = None
    children = Children()
    try:
        broker.start()
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
            support.store_messages(engine, queue, "noop", spec.backlog, grouped=False)
            for table in ("outbox", "inbox"):
                support.analyze(engine, spec.dialect, table)
        finally:
            engine.dispose()
        counters = counters_for(spec.dialect, url)
        counters.prepare()
        note(f"{label}: draining")
        drain(cell, url, queue, broker, counters, children)
        note(f"{label}: {spec.backlog / cell.wall:,.0f} msg/s, {cell.wall:.1f}s")
    except Exception as exc:
        note(f"{label}: FAILED {exc!r}")
        cell.error = str(exc)[:100]
    finally:
        children.stop()
        if counters is not None:
            counters.close()
        broker.stop(queue, spec.keep)
        if spec.keep:
            note(f"kept {url.database} (queue {queue})")
        else:
            support.drop_database(spec.dialect, url)
    return cell


def spawn(spec: Spec, url: URL, queue: str, broker: Broker, children: Children) -> None:
    env, dsn = {"BENCH_QUEUE": queue}, support.dsn_of(url)
    if spec.path == "db":
        for _ in range(spec.workers):
            children.add("workers", support.spawn_ours(dsn, ["--poll-interval", "0.1"], env=env))
        return
    children.add("relay", support.spawn_relay(dsn, broker.url, queue, ["--stop-when-idle"]))
    for _ in range(spec.workers):
        source = ["--source", broker.url]
        children.add("workers", support.spawn_ours(dsn, source, idle=False, env=env))


def drain(
    cell: Cell, url: URL, queue: str, broker: Broker, counters: Counters, children: Children
) -> None:
    spec = cell.spec
    before, broker_before = counters.snapshot(), broker.cpu()
    hold = counters.hold() if spec.hold else None
    reader = counters.reader()
    exclude = {r.link.ident for r in (reader, hold) if r is not None and r.link is not None}
    sampler = Sampler(children, counters.server_threads(exclude))
    sampler.start()
    own: Usage = {}
    try:
        started = time.perf_counter()
        spawn(spec, url, queue, broker, children)
        progress = Progress(spec, reader, counters, children, started)
        timeout = max(900.0, spec.backlog / 100)
        support.wait_for_count(progress.count, spec.backlog, "the drain", timeout=timeout)
        cell.wall = time.perf_counter() - started
        cell.windows = progress.windows()
        if spec.path == "db" and not children.wait("workers", 60):
            note("the workers did not stop when idle within 60s: SIGTERM")
        if not children.wait("relay", 60):
            note("the relay did not stop when idle within 60s: SIGTERM")
        children.stop()
    finally:
        for opened in (hold, reader):
            if opened is not None:
                own = add_usage(own, opened.close())
        server_cpu, sampling = sampler.finish()
        if sampler.error is not None:
            note(f"sampling failed: {sampler.error!r}")
    after, broker_after = counters.snapshot(), broker.cpu()
    own = add_usage(own, sampling)
    cell.cpu = {
        "workers": children.cpu("workers"),
        "relay": children.cpu("relay"),
        "server": server_cpu,
        "broker": broker_after - broker_before,
    }
    cell.usage = {k: after[k] - before[k] - own.get(k, 0.0) for k in after}
    cell.top, cell.statement_wal = counters.top()
    check = counters.reader()
    engine = make_engine(url)
    try:
        done = check.count()
        cell.span = support.inbox_span(engine)
    finally:
        check.close()
        engine.dispose()
    if done != spec.backlog:
        note(f"!!! {done} of {spec.backlog} messages done")
