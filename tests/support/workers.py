"""Spawn ``outbox worker`` OS processes for acceptance tests and read what they recorded."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.engine import URL, make_url

from outbox.dsn import normalize
from tests.support.handlers import effects, effects_metadata, events, events_metadata

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.support.handlers:consumer"


@dataclass
class Bed:
    """The main database (outbox + inbox + effects) and the recorder of handler intervals."""

    dsn: str
    recorder_dsn: str
    engine: Engine
    recorder: Engine
    spawned: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # Settings every spawned worker gets unless the call gives its own (``{"async": 1}``).
    defaults: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, dsn: str, engine: Engine, tmp_path: Path) -> Bed:
        url = make_url(dsn)
        if url.get_backend_name() == "sqlite":
            recorder_dsn = f"sqlite:///{tmp_path / 'recorder.db'}"
        else:
            recorder_dsn = dsn
        recorder = create_engine(normalize(recorder_dsn))
        effects_metadata.create_all(engine)
        events_metadata.create_all(recorder)
        return cls(dsn, recorder_dsn, engine, recorder)

    def env(self, **settings: Any) -> dict[str, str]:
        env = dict(os.environ)
        env["OUTBOX_TEST_RECORDER"] = self.recorder_dsn
        env["PYTHONPATH"] = str(ROOT)
        for key, value in (self.defaults | settings).items():
            env[f"OUTBOX_TEST_{key.upper()}"] = (
                json.dumps(value) if isinstance(value, list) else str(value)
            )
        return env

    def spawn(
        self,
        *,
        stop_when_idle: bool = True,
        time_limit: float = 90.0,
        poll_interval: float = 0.05,
        concurrency: int = 1,
        extra: Sequence[str] = (),
        log: Path | None = None,
        **settings: Any,
    ) -> subprocess.Popen[bytes]:
        """``extra`` comes last, so it may override the options above (``--log-level``);
        ``log``: a file the worker's stderr is appended to."""
        args = [
            sys.executable,
            "-m",
            "outbox_cli",
            "worker",
            TARGET,
            "--dsn",
            self.dsn,
            "--poll-interval",
            str(poll_interval),
            "--time-limit",
            str(time_limit),
            "--concurrency",
            str(concurrency),
            "--log-level",
            "WARNING",
            *extra,
        ]
        if stop_when_idle:
            args.append("--stop-when-idle")
        if log is None:
            process = subprocess.Popen(args, cwd=ROOT, env=self.env(**settings))
        else:
            with log.open("ab") as err:
                process = subprocess.Popen(args, cwd=ROOT, env=self.env(**settings), stderr=err)
        self.spawned.append(process)
        return process

    def events(self) -> list[Any]:
        with self.recorder.connect() as conn:
            return list(conn.execute(select(events).order_by(events.c.id)).all())

    def effects(self) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(effects).order_by(effects.c.id)).all())

    def dispose(self) -> None:
        """Kill what a failed test left running, before its database is dropped."""
        for process in self.spawned:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.recorder.dispose()


def wait_all(processes: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for process in processes:
        remaining = max(0.1, deadline - time.monotonic())
        try:
            codes.append(process.wait(timeout=remaining))
        except subprocess.TimeoutExpired:
            _print_stacks(process)
            process.kill()
            process.wait()
            raise
    return codes


def _print_stacks(process: subprocess.Popen[bytes]) -> None:
    """A process that did not exit in time prints its threads' stacks to its stderr (the
    test's captured output) before it is killed: the failure then says where it was stuck.
    Our relay and worker commands dump on SIGUSR1; a process that does not is killed by it."""
    try:
        process.send_signal(signal.SIGUSR1)
        process.wait(timeout=2)  # it goes on after the dump: this wait is the dump's time
    except subprocess.TimeoutExpired:
        pass


def handles_signal(process: subprocess.Popen[bytes], signum: int) -> bool:
    """Has ``process`` installed a handler for ``signum``? (Linux: the SigCgt mask in
    /proc/PID/status.) A worker installs its SIGTERM handler when its run loop starts; before
    that, during its imports, SIGTERM kills it with the default action (exit -15)."""
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (signum - 1) & 1)


def sigterm_when_ready(process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM a worker once it handles SIGTERM (or has exited): a test that stops workers
    which had nothing to do must not kill one still starting up on a loaded machine."""
    wait_for(
        lambda: process.poll() is not None or handles_signal(process, signal.SIGTERM),
        timeout,
        f"process {process.pid} to install its SIGTERM handler",
    )
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy, with a deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def started_order(rows: Sequence[Any], group: str | None = None) -> list[str]:
    """Marks in the order their successful-or-not runs started (each start once per run)."""
    return [r.mark for r in rows if r.kind == "start" and (group is None or r.grp == group)]


def completed_order(rows: Sequence[Any], group: str | None = None) -> list[str]:
    """Marks in the order of their last start (the run that took effect, for retried ones)."""
    last: dict[str, int] = {}
    for index, r in enumerate(rows):
        if r.kind == "start" and (group is None or r.grp == group):
            last[r.mark] = index
    return [mark for mark, _ in sorted(last.items(), key=lambda item: item[1])]


def overlaps(rows: Sequence[Any], group: str) -> list[tuple[str, str]]:
    """Pairs of runs of ``group`` that were running at the same time, from the recorded event
    sequence (a start while another run of the group has not ended) and from wall times."""
    found: list[tuple[str, str]] = []
    running: dict[tuple[str, int, int], Any] = {}
    for r in rows:
        if r.grp != group:
            continue
        run = (r.mark, r.attempt, r.pid)
        if r.kind == "start":
            for other in running.values():
                found.append((other.mark, r.mark))
            running[run] = r
        else:
            running.pop(run, None)
    intervals = []
    starts: dict[tuple[str, int, int], float] = {}
    for r in rows:
        if r.grp != group:
            continue
        run = (r.mark, r.attempt, r.pid)
        if r.kind == "start":
            starts[run] = r.at
        elif run in starts:
            intervals.append((starts.pop(run), r.at, r.mark))
    intervals.sort()
    for (_, end1, m1), (start2, _, m2) in itertools.pairwise(intervals):
        if start2 < end1:
            found.append((m1, m2))
    return found


def pg_listeners(engine: Engine) -> int:
    """PostgreSQL: workers whose LISTEN thread runs (started after their signal handlers)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            ).scalar_one()
        )


def dsn_of(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def deliver(dsn: str, envelope: dict[str, Any], barrier: Any) -> tuple[int, int]:
    """In a spawned process: ingest one message as a broker source would (S5)."""
    from inbox.ingest import InboxIngest
    from outbox.dsn import make_engine
    from outbox.wire import Envelope
    from tests.support.handlers import consumer

    engine = make_engine(dsn)
    ingest = InboxIngest(consumer, engine)
    if barrier is not None:
        barrier.wait(30)
    with engine.begin() as conn:
        result = ingest.within(conn, [Envelope(**envelope)])
    engine.dispose()
    return result.inserted, result.duplicates
