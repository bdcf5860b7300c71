"""Harness of the fault suite: the whole pipeline as OS processes.

producer (a thread of the test: ``store_many``) -> ``outbox relay`` processes -> broker ->
``outbox worker --source <broker>`` processes running ``tests.support.handlers:consumer``,
whose handler writes an effect row in its transaction and records its start and end.
``tests.faults.verdict`` turns what the database recorded into a ``Verdict`` (lost, double
effects, group overlaps, duplicates the inbox absorbed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import pika
from sqlalchemy import func, select, update

from outbox import Message, states, store_many
from outbox.schema import inbox_table, outbox_table
from tests.support import services
from tests.support.workers import ROOT, Bed

TARGET = "tests.support.handlers:consumer"
GROUPS = 50
RELAY_OUTAGE = "broker unavailable"  # relay/relay.py, a batch rolled back or a reconnect failed
SOURCE_FAILED = "source failed"  # inbox/worker.py, the broker source raised


def scaled(total: int) -> int:
    """``total`` times ``OUTBOX_FAULTS_SCALE`` (default 1: the figures README quotes), in hundreds:
    a knob for a quick local run or a slow machine, never below 400 messages."""
    factor = float(os.environ.get("OUTBOX_FAULTS_SCALE", "1"))
    return max(400, round(total * factor / 100) * 100)


def messages(queue: str, total: int) -> list[Message]:
    """``total`` jobs: 4 in 5 in one of 50 serial groups (the key defaults to the group), the
    rest ungrouped; priorities 1 and 2, so two broker queues/topics are in play."""
    return [
        Message(
            queue,
            "job",
            {"mark": f"m{i}"},
            priority=1 + i % 2,
            serial_group=None if i % 5 == 4 else f"g{i % GROUPS}",
        )
        for i in range(total)
    ]


class Proc:
    """One OS process logging to a file; ``ready()`` counts a marker line per start."""

    def __init__(self, args: Sequence[str], log: Path, marker: str, env: dict[str, str]) -> None:
        self.args, self.log, self.marker, self.env = list(args), log, marker, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Proc:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=out, cwd=ROOT, env=self.env)
        self.starts += 1
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def ready(self) -> bool:
        return self.text().count(self.marker) >= self.starts

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code (SIGKILL and raise if it does not exit in time)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def dispose(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def poll(condition: Callable[[], Any], timeout: float, interval: float = 0.25) -> bool:
    """Poll ``condition`` until truthy or the deadline; False on timeout (the caller reports
    what it found, which says more than "timed out")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> None:
    if not poll(condition, timeout, 0.05):
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Pipeline:
    """One scenario's processes on one database and one broker.

    ``relay_broker`` / ``source``: the URLs the relays and the workers use (a proxy's, when
    the test cuts or stalls the broker's port)."""

    bed: Bed
    tmp: Path
    queue: str
    relay_broker: str
    source: str
    consumer: str = ""
    relays: list[Proc] = field(default_factory=list)
    workers: list[Proc] = field(default_factory=list)
    stored: int = 0
    _counting: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.consumer = self.consumer or f"faults-{self.queue}"

    # -- processes ----------------------------------------------------------------------------

    def add_relay(self, *extra: str, confirm_timeout: float | None = None) -> Proc:
        if confirm_timeout is not None:
            extra = (*extra, "--confirm-timeout", str(confirm_timeout))
        args = [
            sys.executable, "-m", "outbox_cli", "relay", "--dsn", self.bed.dsn,
            "--broker", self.relay_broker, "--queue", self.queue, "--poll-interval", "0.1",
            "--batch-size", "100", *extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        relay = Proc(args, self.tmp / f"relay{len(self.relays)}.log", "relay started", env)
        self.relays.append(relay)
        return relay.start()

    def add_worker(self, concurrency: int = 2) -> Proc:
        args = [
            sys.executable, "-m", "outbox_cli", "worker", TARGET, "--dsn", self.bed.dsn,
            "--source", self.source, "--poll-interval", "0.2",
            "--concurrency", str(concurrency), "--log-level", "INFO",
        ]  # fmt: skip
        # the sources' INFO line once they receive: RabbitMQ "consuming", Kafka "assigned"
        marker = "consuming " if self.source.startswith("amqp") else "assigned "
        env = self.bed.env(queues=[self.queue], consumer=self.consumer)
        worker = Proc(args, self.tmp / f"worker{len(self.workers)}.log", marker, env)
        self.workers.append(worker)
        return worker.start()

    def wait_ready(self, timeout: float = 180) -> None:
        wait_until(lambda: all(p.ready() for p in self.relays + self.workers), timeout, "ready")

    def stop(self) -> tuple[list[int], list[int]]:
        """SIGTERM everything; the exit codes of the relays and of the workers."""
        return [r.stop() for r in self.relays], [w.stop() for w in self.workers]

    def dispose(self) -> None:
        for process in self.relays + self.workers:
            process.dispose()

    # -- load ---------------------------------------------------------------------------------

    def store(self, batch: Sequence[Message], chunk: int = 100) -> None:
        """Store ``batch`` in transactions of ``chunk`` rows (from any thread)."""
        for start in range(0, len(batch), chunk):
            with self.bed.engine.begin() as conn:
                store_many(conn, batch[start : start + chunk])
            with self._counting:
                self.stored += len(batch[start : start + chunk])

    def produce(self, batch: Sequence[Message], pause: float) -> threading.Thread:
        """Store ``batch`` from a thread, 100 rows every ``pause`` seconds, so a fault lands
        while rows are still arriving (pacing the load, not synchronisation). The tests also
        store rows right after starting a fault: a relay with nothing to publish would not
        notice a dead broker."""

        def run() -> None:
            for start in range(0, len(batch), 100):
                self.store(batch[start : start + 100])
                time.sleep(pause)

        thread = threading.Thread(target=run, name="producer", daemon=True)
        thread.start()
        return thread

    # -- what the database says ---------------------------------------------------------------

    def count_done(self) -> int:
        with self.bed.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).where(
                        inbox_table.c.consumer == self.consumer,
                        inbox_table.c.state.in_((states.DONE, states.FAILED)),
                    )
                ).scalar_one()
            )

    def count_sent(self) -> int:
        with self.bed.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).where(outbox_table.c.status == states.SENT)
                ).scalar_one()
            )

    def wait_sent(self, count: int, timeout: float = 120) -> None:
        """Until ``count`` rows are marked sent, looking every 10 ms (a kill's instant)."""
        if not poll(lambda: self.count_sent() >= count, timeout, 0.01):
            raise AssertionError(f"timed out after {timeout}s waiting for {count} sent")

    def wait_done(self, count: int, timeout: float = 300) -> None:
        wait_until(lambda: self.count_done() >= count, timeout, f"{count} messages done")

    def wait_finished(self, total: int, timeout: float) -> bool:
        return poll(lambda: self.stored == total and self.count_done() >= total, timeout, 0.5)

    def stored_ids(self) -> set[UUID]:
        with self.bed.engine.connect() as conn:
            return set(
                conn.execute(
                    select(outbox_table.c.event_id).where(outbox_table.c.queue == self.queue)
                ).scalars()
            )

    def replay_sent(self) -> int:
        """The operator's answer to a broker that lost its data: publish every sent row
        again (the inbox absorbs the copies that had arrived). Returns how many."""
        with self.bed.engine.begin() as conn:
            return int(
                conn.execute(
                    update(outbox_table)
                    .where(outbox_table.c.status == states.SENT)
                    .values(status=states.PENDING, sent_at=None)
                ).rowcount
            )

    def failures(self) -> tuple[int, int]:
        """Lines logged so far: relay outages (a failed batch or reconnect), worker source
        failures."""
        relays = sum(r.text().count(RELAY_OUTAGE) for r in self.relays)
        return relays, sum(w.text().count(SOURCE_FAILED) for w in self.workers)

    def wait_failures(
        self, since: tuple[int, int], rounds: int, workers: int = 0, timeout: float = 60
    ) -> None:
        """Until ``rounds`` more outage lines per relay and ``workers`` more source failures
        were logged than at ``since``."""

        def seen() -> bool:
            relays, sources = self.failures()
            return relays >= since[0] + rounds * len(self.relays) and sources >= since[1] + workers

        wait_until(seen, timeout, f"{rounds} rounds of relay failures, {workers} of workers")


MakePipeline = Callable[[str, str], Pipeline]  # the fixture: (relay broker, worker source)


# -- RabbitMQ side ------------------------------------------------------------------------------


def require_rabbitmq() -> str:
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")
    return services.RABBITMQ_URL


def rabbit_leftovers(url: str, names: Sequence[str]) -> list[str]:
    """Read (and remove) what is still queued at RabbitMQ; the event ids found."""
    found: list[str] = []
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as conn:
        channel = conn.channel()
        for name in names:
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                while True:
                    method, properties, _body = channel.basic_get(name, auto_ack=True)
                    if method is None:
                        break
                    found.append(str(properties.message_id))
            if channel.is_closed:
                channel = conn.channel()
    return found


def delete_rabbit_queues(url: str, names: Sequence[str]) -> None:
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as conn:
        channel = conn.channel()
        for name in names:
            channel.queue_delete(name)
