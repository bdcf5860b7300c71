"""Worker and connection fault scenarios: the pipeline, the kills, the checks.

Pipeline: rows stored up front -> ``outbox relay`` processes -> RabbitMQ or Kafka -> several
``outbox worker tests.support.handlers:consumer`` processes (or the workers take the rows from
the database themselves). The handler writes one effect row in its transaction and records a
start and an end event through a separate autocommit connection (tests/support/handlers.py).

Relays and workers connect under names of their own, so a test can find and kill exactly their
database connections: ``application_name`` on PostgreSQL, a user of their own on MariaDB
(performance_schema, which would show connect attributes, is off there).

The verdict is read from the database only (``Tally``): every stored event_id has one done
inbox row or a failed one with its reason, one effect per done row and none for a failed one,
no two runs of a group overlapping in wall time, and the duplicates the inbox absorbed.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import URL, make_url

from outbox import inbox_table, states
from outbox.schema import outbox_table
from outbox.store import Message
from tests.integration.relay.helpers import RelayProcess, rabbit_channel, store_rows
from tests.support import services
from tests.support.handlers import effects, events
from tests.support.workers import Bed, wait_for

GROUPS = 50
SOURCES = ("database", "rabbitmq", "kafka")
SHORT = {"postgresql": "pg", "mariadb": "mariadb"}
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
        worker = self.bed.spawn(
            stop_when_idle=False,
            time_limit=600,
            concurrency=2,
            extra=[*extra, "--log-level", "ERROR"],
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

    def kill_connection(self, connection_id: int) -> bool:
        with self.bed.engine.connect() as conn:
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
    faults = FaultBed(bed, dialect, source, broker_url, tmp_path)
    try:
        faults.setup()
        yield faults
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


# --- the verdict ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    mark: str
    group: str | None
    start: float
    end: float  # the end event, or the SIGKILL of its process, or +inf: never ended
    killed: bool = False  # its process was SIGKILLed inside the handler


@dataclass(frozen=True)
class Tally:
    stored: int
    done: int
    failed: int
    lost: list[str]
    double: list[str]
    overlaps: list[tuple[str, str]]
    duplicates: int
    killed_in_handler: int = 0

    def problems(self) -> list[str]:
        found = []
        if self.lost:
            found.append(f"{len(self.lost)} lost, e.g. {self.lost[:5]}")
        if self.double:
            found.append(f"{len(self.double)} with a wrong effect count, e.g. {self.double[:5]}")
        if self.overlaps:
            found.append(f"{len(self.overlaps)} overlapping runs, e.g. {self.overlaps[:5]}")
        return found

    def line(self, scenario: str, dialect: str, source: str, **extra: int) -> str:
        tail = "".join(f" {k}={v}" for k, v in extra.items())
        return (
            f"FAULT {scenario} {SHORT.get(dialect, dialect)} {source}: stored={self.stored}"
            f" done={self.done} lost={len(self.lost)} double={len(self.double)}"
            f" overlaps={len(self.overlaps)} duplicates_absorbed={self.duplicates}{tail}"
        )


def tally(
    stored: Sequence[Any],
    inbox: Sequence[Any],
    effect_ids: Sequence[Any],
    runs: Sequence[Run],
) -> Tally:
    """``stored``: event ids of the outbox; ``inbox``: rows (event_id, state, last_error,
    duplicates) of the consumer; ``effect_ids``: the event_id of every effect row."""
    rows = {r.event_id: r for r in inbox}
    effect_count = Counter(effect_ids)
    lost, double = [], []
    for event_id in stored:
        row = rows.get(event_id)
        if row is None or not (
            row.state == states.DONE or (row.state == states.FAILED and row.last_error)
        ):
            lost.append(str(event_id))  # no row, unfinished, or failed without a reason
        elif row.state == states.DONE and effect_count[event_id] == 0:
            lost.append(str(event_id))  # done, but its effect is missing
        elif effect_count[event_id] != (1 if row.state == states.DONE else 0):
            double.append(str(event_id))
    double += [str(e) for e in effect_count if e not in rows]  # an effect nobody stored
    return Tally(
        stored=len(stored),
        done=sum(1 for r in inbox if r.state == states.DONE),
        failed=sum(1 for r in inbox if r.state == states.FAILED),
        lost=lost,
        double=double,
        overlaps=group_overlaps(runs),
        duplicates=sum(int(r.duplicates) for r in inbox),
        killed_in_handler=sum(1 for r in runs if r.killed),
    )


def runs_from(events: Sequence[Any], kill_times: dict[int, float]) -> list[Run]:
    """Handler runs from the recorded events; a run without an end event ended when its
    process was SIGKILLed, or never (+inf, which overlaps everything after it)."""
    open_runs: dict[tuple[str, int, int], Any] = {}
    runs = []
    for e in events:
        key = (e.mark, e.attempt, e.pid)
        if e.kind == "start":
            open_runs[key] = e
        elif key in open_runs:
            s = open_runs.pop(key)
            runs.append(Run(s.mark, s.grp, s.at, e.at))
    for s in open_runs.values():
        end = kill_times.get(s.pid, math.inf)
        runs.append(Run(s.mark, s.grp, s.at, end, killed=end < math.inf))
    return runs


def group_overlaps(runs: Sequence[Run]) -> list[tuple[str, str]]:
    """Pairs of runs of one serial group whose wall-time intervals intersect."""
    by_group: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.group is not None:
            by_group[run.group].append(run)
    found = []
    for group_runs in by_group.values():
        group_runs.sort(key=lambda r: r.start)
        active: list[Run] = []
        for run in group_runs:
            active = [a for a in active if a.end > run.start]
            found += [(a.mark, run.mark) for a in active]
            active.append(run)
    return found


def measure(faults: FaultBed) -> Tally:
    bed = faults.bed
    with bed.engine.connect() as conn:
        stored = list(
            conn.execute(
                select(outbox_table.c.event_id).where(outbox_table.c.queue == faults.queue)
            ).scalars()
        )
        inbox = conn.execute(
            select(
                inbox_table.c.event_id,
                inbox_table.c.state,
                inbox_table.c.last_error,
                inbox_table.c.duplicates,
            ).where(inbox_table.c.consumer == faults.consumer)
        ).all()
        effect_ids = list(conn.execute(select(effects.c.event_id)).scalars())
    return tally(stored, inbox, effect_ids, runs_from(bed.events(), faults.kill_times))
