"""Worker and connection fault scenarios: the pipeline, the kills, the checks.

Pipeline: rows stored up front -> ``outbox relay`` processes -> RabbitMQ or Kafka -> several
``outbox worker tests.support.handlers:consumer`` processes (or the workers take the rows from
the database themselves). The handler writes one effect row in its transaction and records a
start and an end event through a separate autocommit connection (tests/support/handlers.py).

Relays and workers connect under names of their own, so a test can find and kill exactly their
database connections: ``application_name`` on PostgreSQL, a user of their own on MariaDB
(performance_schema, which would show connect attributes, is off there).

The verdict is read from the database only (tests/faults/tally.py). On a failure the
scenario's evidence (tests/faults/evidence.py: the overlapping runs with their claims, the
kills around them, the workers' and relays' logs) goes into the failure's message, and the
logs are kept under build/fault-logs/.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import URL, make_url

from outbox import inbox_table, states
from outbox.store import Message
from tests.faults.evidence import (
    Kill,
    as_csv,
    connection_detail,
    describe_kill,
    describe_rows,
    explain_overlaps,
    keep_logs,
    socket_owner,
)
from tests.faults.tally import Tally, runs_from
from tests.integration.relay.helpers import RelayProcess, rabbit_channel, store_rows
from tests.support import services
from tests.support.handlers import events
from tests.support.workers import Bed, wait_for

GROUPS = 50
SOURCES = ("database", "rabbitmq", "kafka")
TRAPS = uuid.UUID("0f3c52d1-2b7e-4c55-9d8e-5a41c2f7b901")  # namespace of the traps' event ids


def trap_event_id(queue: str, mark: str) -> uuid.UUID:
    return uuid.uuid5(TRAPS, f"{queue}/{mark}")


def load(queue: str, total: int, traps: Sequence[str] = ()) -> list[Message]:
    """``total`` jobs: two in three in one of 50 serial groups, the rest ungrouped; priorities
    1 and 2 mixed. Each trap is a grouped job whose first run hangs for a minute (the test
    kills the worker inside it); traps come first, so they are the heads of their groups."""
    messages = [
        Message(
            queue,
            "job",
            {"mark": mark, "sleep_first": 60},
            serial_group=f"g{n}",
            event_id=trap_event_id(queue, mark),
        )
        for n, mark in enumerate(traps)
    ]
    for i in range(total - len(traps)):
        grouped = i % 3 != 2
        messages.append(
            Message(
                queue,
                "job",
                {"mark": f"m{i}", "sleep": 0.004 if grouped else 0.0},
                priority=1 + (i % 5 == 0),
                serial_group=f"g{i % GROUPS}" if grouped else None,
            )
        )
    return messages


@dataclass
class FaultBed:
    """One scenario's processes. ``bed.dsn`` (what workers get) carries the worker's name;
    the recorder and the test's own engine keep the plain DSN, so kills never hit them."""

    bed: Bed
    dialect: str
    source: str
    broker_url: str | None
    tmp_path: Path
    queue: str = field(default_factory=lambda: f"flt_{uuid.uuid4().hex[:10]}")
    relay_dsn: str = ""
    names: dict[str, str] = field(default_factory=dict)  # role -> application or user name
    users: list[str] = field(default_factory=list)
    relays: list[RelayProcess] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    kill_times: dict[int, float] = field(default_factory=dict)  # worker pid -> SIGKILL time
    label: str = "fault"  # the test's name, for the logs kept on failure
    logs: list[Path] = field(default_factory=list)  # every worker's and relay's log
    killed: list[Kill] = field(default_factory=list)  # connections killed (kill_connection)

    @property
    def consumer(self) -> str:
        return f"c-{self.queue}"

    def setup(self) -> None:
        plain = make_url(self.bed.dsn)
        self.relay_dsn = self._named(plain, "relay")
        self.bed.dsn = self._named(plain, "worker")

    def _named(self, url: URL, role: str) -> str:
        if self.dialect == "postgresql":
            self.names[role] = f"outbox-fault-{role}"
            named = url.update_query_dict({"application_name": self.names[role]})
        else:
            user = f"f{role[0]}_{uuid.uuid4().hex[:10]}"
            self.names[role] = user
            with self.bed.engine.connect() as conn:
                # Names are ours (hex), not user input; DDL takes no bound parameters.
                conn.execute(text(f"CREATE USER '{user}'@'127.0.0.1'"))
                conn.execute(
                    text(f"GRANT ALL PRIVILEGES ON `{url.database}`.* TO '{user}'@'127.0.0.1'")
                )
                conn.commit()
            self.users.append(user)
            named = url.set(username=user, password=None)
        return named.render_as_string(hide_password=False)

    # --- processes --------------------------------------------------------------------------

    def spawn_worker(self, visibility: float, max_attempts: int) -> subprocess.Popen[bytes]:
        extra = ["--source", self.broker_url] if self.broker_url else []
        log = self.tmp_path / f"worker{len(self.logs)}.log"
        self.logs.append(log)
        worker = self.bed.spawn(
            stop_when_idle=False,
            time_limit=600,
            concurrency=2,
            extra=[*extra, "--log-level", "INFO"],
            log=log,
            consumer=self.consumer,
            queues=[self.queue],
            visibility=visibility,
            max_attempts=max_attempts,
        )
        self.workers.append(worker)
        return worker

    def start_relays(self, count: int) -> None:
        if self.broker_url is None:
            return  # the database source: the workers take the rows themselves
        for i in range(count):
            relay = RelayProcess(
                self.relay_dsn,
                self.tmp_path / f"relay{i}.log",
                "--queue", self.queue, "--poll-interval", "0.05", "--batch-size", "100",
                broker=self.broker_url,
            )  # fmt: skip
            self.logs.append(relay.log)
            self.relays.append(relay.start())
        wait_for(lambda: all(r.started() for r in self.relays), 60, "the relays to start")

    def kill_worker(self, worker: subprocess.Popen[bytes]) -> None:
        self.kill_times[worker.pid] = time.time()  # before the signal: an upper bound of its runs
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        self.workers.remove(worker)

    def starts(self, mark: str) -> list[Any]:
        """Recorded starts of the job ``mark`` (pid, attempt, at), in the order they were
        recorded. The ORDER BY is needed: without it PostgreSQL once returned the re-run's start
        first (several processes insert at once, each can fill a different page, so the
        table's physical order is not the insert order) and the test read it as the first."""
        with self.bed.recorder.connect() as conn:
            return list(
                conn.execute(
                    select(events)
                    .where(events.c.mark == mark, events.c.kind == "start")
                    .order_by(events.c.id)
                ).all()
            )

    def lease_until(self, event_id: uuid.UUID) -> float:
        """When the claim on ``event_id`` runs out (epoch seconds, the workers' clock)."""
        with self.bed.engine.connect() as conn:
            lease = conn.execute(
                select(inbox_table.c.lease_until).where(
                    inbox_table.c.consumer == self.consumer, inbox_table.c.event_id == event_id
                )
            ).scalar_one()
        return float(lease.timestamp())

    def reached(self, count: int) -> Callable[[], bool]:
        """A condition for ``wait_for``: at least ``count`` messages finished."""
        return lambda: self.finished() >= count

    def finished(self) -> int:
        """Inbox rows of the consumer that reached an end state (done or failed)."""
        with self.bed.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).where(
                        inbox_table.c.consumer == self.consumer,
                        inbox_table.c.state.in_([states.DONE, states.FAILED]),
                    )
                ).scalar_one()
            )

    def stop_all(self) -> list[int]:
        """SIGTERM everything still running; the exit codes (0 = a clean stop). A worker
        respawned just before the end may still be importing: SIGTERM would kill it before
        its handler exists, so first wait until every worker catches SIGTERM."""
        wait_for(lambda: all(map(catches_sigterm, self.workers)), 60, "the workers to run")
        for worker in self.workers:
            worker.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=60) for w in self.workers]
        codes += [r.stop() for r in self.relays]
        return codes

    def teardown(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for relay in self.relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.proc.kill()
                relay.proc.wait()
        with self.bed.engine.connect() as conn:
            for user in self.users:
                conn.execute(text(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'"))
            conn.commit()
        if self.source == "rabbitmq":
            with rabbit_channel() as channel:
                for priority in range(1, 10):  # the workers declare every priority's queue
                    channel.queue_delete(f"{self.queue}_{priority}")

    # --- connections of the relays and workers ----------------------------------------------

    def connections(self, role: str) -> list[tuple[int, bool]]:
        """(server connection id, busy) of the relays' (``role`` relay) or workers' database
        connections; busy = inside a statement or a transaction right now."""
        with self.bed.engine.connect() as conn:
            if self.dialect == "postgresql":
                rows = conn.execute(
                    text(
                        "SELECT pid, state <> 'idle' FROM pg_stat_activity"
                        " WHERE datname = current_database() AND application_name = :app"
                    ),
                    {"app": self.names[role]},
                ).all()
            else:
                rows = conn.execute(
                    text(
                        "SELECT p.id, p.command <> 'Sleep' OR t.trx_id IS NOT NULL"
                        " FROM information_schema.PROCESSLIST p"
                        " LEFT JOIN information_schema.INNODB_TRX t"
                        " ON t.trx_mysql_thread_id = p.id"
                        " WHERE p.db = DATABASE() AND p.user = :user"
                    ),
                    {"user": self.names[role]},
                ).all()
        return [(int(r[0]), bool(r[1])) for r in rows]

    def kill_connection(self, connection_id: int, role: str = "") -> bool:
        with self.bed.engine.connect() as conn:
            port, what = connection_detail(conn, self.dialect, connection_id)
            pids = [w.pid for w in self.workers] + [r.proc.pid for r in self.relays if r.proc]
            owner = socket_owner(port, pids)
            self.killed.append(Kill(time.time(), role, connection_id, port, owner, what))
            if self.dialect == "postgresql":
                return bool(
                    conn.execute(
                        text("SELECT pg_terminate_backend(:pid)"), {"pid": connection_id}
                    ).scalar_one()
                )
            try:  # KILL takes no placeholder: the id is an int read from the server
                conn.execute(text(f"KILL CONNECTION {int(connection_id)}"))
            except Exception:  # gone meanwhile (ended by itself)
                return False
            return True

    def evidence(self, result: Tally | None = None) -> str:
        """For a failure's message: the overlapping runs with their claims and the kills
        around them, the inbox rows involved, and the logs, kept under build/ with every
        recorded run and the consumer's inbox rows (CSV). Never raises: it must not hide the
        failure it explains."""
        parts = []
        kept = {"kills.txt": "\n".join(describe_kill(k) for k in self.killed)}
        try:
            events = self.bed.events()
            with self.bed.engine.connect() as conn:
                inbox = conn.execute(
                    select(inbox_table)
                    .where(inbox_table.c.consumer == self.consumer)
                    .order_by(inbox_table.c.id)
                ).all()
            kept |= {"events.csv": as_csv(events), "inbox.csv": as_csv(inbox)}
            if result is not None and result.overlap_runs:
                runs = runs_from(events, self.kill_times)
                parts.append(explain_overlaps(result.overlap_runs, runs, self.killed))
                ids = {r.row_id for pair in result.overlap_runs for r in pair if r.row_id}
                parts.append(describe_rows([r for r in inbox if r.id in ids]))
        except Exception as exc:  # the database went away: the logs still help
            parts.append(f"(runs and inbox rows not read: {exc!r})")
        parts.append(keep_logs(self.label, self.logs, kept))
        return "\n".join(parts)


def catches_sigterm(process: subprocess.Popen[bytes]) -> bool:
    """Linux: the process installed a SIGTERM handler (``SigCgt`` in /proc/PID/status); for
    ``outbox worker`` that happens as its threads start. A process that exited is "ready"
    too: its exit code tells."""
    if process.poll() is not None:
        return True
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except FileNotFoundError:
        return True
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@contextlib.contextmanager
def fault_bed(
    request: pytest.FixtureRequest, bed: Bed, dialect: str, source: str, tmp_path: Path
) -> Iterator[FaultBed]:
    broker_url: str | None = None
    if source == "rabbitmq":
        if not services.port_open("127.0.0.1", 5672):
            services.missing("rabbitmq", "127.0.0.1:5672 closed")
        broker_url = services.RABBITMQ_URL
    elif source == "kafka":
        broker_url = request.getfixturevalue("kafka_broker").url
    faults = FaultBed(bed, dialect, source, broker_url, tmp_path, label=request.node.nodeid)
    try:
        faults.setup()
        yield faults
    except BaseException as exc:
        # A deadline missed inside the scenario: the logs say what the processes were doing.
        exc.add_note(faults.evidence())
        raise
    finally:
        faults.teardown()


class Producer:
    """Stores ``messages`` in chunks while the scenario runs, keeping at most ``backlog``
    unfinished, so relays publish and workers receive all along (kills land mid-ingest too).
    Flow control on what the database says is finished, not on sleeps."""

    def __init__(
        self, faults: FaultBed, messages: Sequence[Message], chunk: int = 100, backlog: int = 400
    ) -> None:
        self.faults = faults
        self.messages = list(messages)
        self.chunk = chunk
        self.backlog = backlog
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="fault-producer", daemon=True)

    def start(self) -> Producer:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for start in range(0, len(self.messages), self.chunk):
                wait_for(self.faults.reached(start - self.backlog), 240, "the backlog")
                store_rows(self.faults.bed.engine, self.messages[start : start + self.chunk])
        except BaseException as exc:  # handed to the test by join()
            self.error = exc

    def join(self, timeout: float = 240) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error


def random_pause(rng: random.Random, low: float, high: float) -> None:
    """A random instant in the life of the processes (not synchronisation)."""
    time.sleep(rng.uniform(low, high))
