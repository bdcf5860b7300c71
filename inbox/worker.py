"""The worker process: one source thread (receive -> ingest), N handler threads (claim a batch
-> run it in one transaction), a heartbeat thread renewing every held lease, and on
PostgreSQL a LISTEN thread that wakes them. SIGTERM lets running batches finish.

A handler thread that finishes a batch claims again at once, looking first at the groups its
batch freed: a group's next message starts right after its predecessor commits, not after a
poll interval. Idle threads wait for a wake-up (NOTIFY, local ingest, a retry falling due)
or ``poll_interval``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from inbox.consumer import Consumer
from inbox.engine.claims import BatchClaimer, Claim
from inbox.engine.cycle import ClaimAndRun
from inbox.engine.heads import HeadPass
from inbox.engine.leases import LeaseKeeper
from inbox.engine.outcomes import DONE, LOST
from inbox.engine.runner import BatchRunner
from inbox.ingest import InboxIngest, IngestResult, wake_payload
from inbox.settings import WorkerOptions as WorkerOptions
from inbox.sql import claims as q
from inbox.startup import brief, holds_outbox
from outbox import metrics, states
from outbox.backoff import outage_delay
from outbox.clock import utcnow
from outbox.dialect import POSTGRESQL, dialect_of
from outbox.stop_signals import install_stop_signals
from outbox.transport import Source

log = logging.getLogger("inbox.worker")

# A freed group whose lock was busy is asked for again after this long (at most
# ``inbox.engine.cycle.FREED_TRIES`` times; past that the head-of-group pass promotes its head).
FREED_RETRY_SECONDS = 0.01


class Worker:
    def __init__(
        self,
        consumer: Consumer,
        engine: Engine,
        source: Source,
        options: WorkerOptions | None = None,
        *,
        job_queue: bool | None = None,
        broker: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        self.consumer = consumer
        self.engine = engine
        self.source = source
        self.options = options or WorkerOptions()
        # Given: set by a stop request that may come while this is built (inbox/cli
        # `worker`), when the start-up check below may be waiting for the database.
        self.stop = stop or threading.Event()
        self.claim_wake = threading.Event()
        self.ingest = InboxIngest(consumer, engine)
        self.ingest.on_ingested = self._ingested
        # None: the database did not answer within the time limit; run() then ends at once.
        self.started_unreachable = False
        self.created = time.monotonic()
        if job_queue is None:
            holds = holds_outbox(engine, consumer, self.options.time_limit, self.stop)
            self.started_unreachable = holds is None and not self.stop.is_set()
            job_queue = bool(holds)
        self.heads = HeadPass(consumer, engine, job_queue=job_queue, broker=broker)
        self.heads.on_promoted = self._promoted
        self.claimer = BatchClaimer(consumer, engine, job_queue=job_queue, broker=broker)
        self.runner = BatchRunner(
            consumer,
            engine,
            isolation=self.options.isolation,
            batch_seconds=self.options.batch_seconds,
        )
        self.runner.calls.check()
        self.runner.gate.on_ready = self.claimer.look_back
        self.leases = LeaseKeeper(consumer, engine)
        self.inbox = self.claimer.inbox
        self.source_empty = False
        self.last_busy = time.monotonic()
        self.processed: dict[str, int] = {}
        self.duplicates = 0
        self.exit_reason = "stopped"
        self._lock = threading.Lock()

    # --- lifecycle --------------------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        """Run until SIGTERM/SIGINT, the time limit, or idle (with stop_when_idle). Returns 0.
        Logs a one-line summary on the way out."""
        if self.started_unreachable or self.stop.is_set():  # stopped before it started
            if self.started_unreachable:
                self.exit_reason = "time limit, database never reachable"
            log.info("%s", self.summary(time.monotonic() - self.created))
            return 0
        uninstall = install_stop_signals(self.request_stop) if install_signals else _nothing
        threads = [threading.Thread(target=self._source_loop, name="inbox-source", daemon=True)]
        threads += [
            threading.Thread(target=self._handler_loop, name=f"inbox-handler-{i}", daemon=True)
            for i in range(self.options.concurrency)
        ]
        beat_stop = threading.Event()
        beat = threading.Thread(
            target=self.leases.run, args=(beat_stop,), name="inbox-heartbeat", daemon=True
        )
        beat.start()
        if dialect_of(self.engine).notifies:
            threads.append(
                threading.Thread(target=self._listen_loop, name="inbox-listen", daemon=True)
            )
        for thread in threads:
            thread.start()
        started = time.monotonic()
        try:
            self._supervise(_Schedule(started, self.options))
        finally:
            self.stop.set()
            self.claim_wake.set()
            self.source.close()
            for thread in threads:
                thread.join()
            beat_stop.set()
            beat.join()
            log.info("%s", self.summary(time.monotonic() - started))
            uninstall()
        return 0

    def _supervise(self, schedule: _Schedule) -> None:
        """Until stopped: the time limit, the head-of-group passes, the idle check."""
        while not self.stop.wait(min(0.2, self.options.poll_interval)):
            now = time.monotonic()
            if self._time_up(schedule, now):
                return
            self._head_passes(schedule, now)
            if self._idle_for_good(schedule, now):
                return

    def _time_up(self, schedule: _Schedule, now: float) -> bool:
        limit = self.options.time_limit
        if limit is None or now - schedule.started < limit:
            return False
        log.info("time limit of %ss reached", limit)
        self.exit_reason = "time limit"
        return True

    def _head_passes(self, schedule: _Schedule, now: float) -> None:
        if now - schedule.last_full_pass >= self.options.full_head_pass_interval:
            schedule.last_full_pass = schedule.last_pass = now
            self._safely(self.full_head_pass)
        elif now - schedule.last_pass >= self.options.head_pass_interval:
            schedule.last_pass = now
            self._safely(self.heads.head_pass)

    def _idle_for_good(self, schedule: _Schedule, now: float) -> bool:
        """With ``stop_when_idle``: idle at two checks in a row. The check reads the whole
        unfinished set: only when nothing happened for a while, and not more often."""
        if not self.options.stop_when_idle:
            return False
        quiet = schedule.quiet
        if now - self.last_busy < quiet or now - schedule.last_idle_check < quiet:
            return False
        schedule.last_idle_check = now
        idle = self.source_empty and bool(self._safely(self.heads.idle))
        schedule.idle_seen = schedule.idle_seen + 1 if idle else 0
        if schedule.idle_seen < 2:
            return False
        log.info("idle: stopping")
        self.exit_reason = "idle"
        return True

    def summary(self, seconds: float) -> str:
        """What this run did, in one line (halted counts as failed: both are dead)."""
        with self._lock:
            counts = dict(self.processed)
            duplicates = self.duplicates
        done, retry = counts.get(DONE, 0), counts.get(states.RETRY, 0)
        failed = counts.get(states.FAILED, 0) + counts.get(states.HALTED, 0)
        return (
            f"worker {self.consumer.name} exiting ({self.exit_reason}): "
            f"{done + retry + failed} processed ({done} done, {retry} retry, {failed} failed), "
            f"{duplicates} duplicates, {counts.get(LOST, 0)} claims lost, ran {seconds:.1f}s"
        )

    def request_stop(self, reason: str) -> None:
        """Stop after the running handlers (SIGTERM/SIGINT, by way of ``install_stop_signals``:
        never from a signal handler itself, see ``outbox.stop_signals``)."""
        self.exit_reason = reason
        log.info("%s: finishing running handlers", reason)
        self.stop.set()
        self.claim_wake.set()

    # --- threads ----------------------------------------------------------------------------

    def _source_loop(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                taken = self.source.run_once(
                    self.ingest, self.options.batch, self.options.poll_interval
                )
            except Exception as exc:
                failures += 1
                self.source_empty = False
                log.error("source failed (%s in a row): %s", failures, brief(exc))
                self.stop.wait(outage_delay(failures))
                continue
            failures = 0
            self.source_empty = taken == 0
            if taken:
                self.last_busy = time.monotonic()

    def _handler_loop(self) -> None:
        # With an async handler, on this thread's event loop (inbox/engine/handler_calls.py).
        self.runner.calls.run(self._claim_and_run)

    def cycle(self) -> ClaimAndRun:
        """A handler thread's claim-and-run cycle (one per thread: it keeps the groups that
        thread freed)."""
        return ClaimAndRun(
            self.claimer,
            self.runner,
            self.leases,
            batch_size=self.options.batch_size,
            share=self.options.concurrency,
        )

    def _claim_and_run(self) -> None:
        failures = 0
        # Its ``freed``: groups this thread's last batch freed, and freed groups a pass could
        # not decide yet (their lock busy for a moment, the batch full): their next head is
        # waiting, no candidate, so nobody else would look before the head pass.
        cycle = self.cycle()
        while not self.stop.is_set():
            claimed = False
            try:
                result = cycle.claim()
                if result.left_some:
                    self.claim_wake.set()  # the rest is for the idle threads
                if result.claims:
                    claimed = True
                    self.last_busy = time.monotonic()
                    self._counted(cycle.run(result.claims))
                    self.last_busy = time.monotonic()
                failures = 0
            except Exception as exc:  # the database went away: back off, never die
                failures += 1
                log.error("handler loop error (%s in a row): %s", failures, brief(exc))
                self.stop.wait(outage_delay(failures))
                continue
            if claimed:
                continue
            wait = FREED_RETRY_SECONDS if cycle.freed else self._idle_wait()
            if self.claim_wake.wait(wait):
                self.claim_wake.clear()
        for group in cycle.freed:  # stopping: let another worker take their next heads now
            self._safely(lambda g=group: self.heads.promote_group(g))

    def _counted(self, outcomes: list[tuple[Claim, str]]) -> None:
        """Count a batch's outcomes for the summary; a retry or deferred change among them
        wakes the idle threads."""
        with self._lock:
            for _, outcome in outcomes:
                self.processed[outcome] = self.processed.get(outcome, 0) + 1
        if any(outcome in (states.RETRY, states.DEFERRED) for _, outcome in outcomes):
            # Idle threads work out their wait again: a retry (or a gap's check) is due.
            self.claim_wake.set()

    def _idle_wait(self) -> float:
        """Seconds an idle thread waits: the poll interval, or less if a retry falls due
        sooner (read from the database: any worker of the consumer may have written it)."""
        poll = self.options.poll_interval
        try:
            with self.engine.connect() as conn:
                due = conn.execute(
                    q.next_retry_due(self.inbox), {"consumer": self.consumer.name}
                ).scalar()
        except Exception:
            return poll
        if due is None:
            return poll
        ahead = float((due - utcnow()).total_seconds())
        # Already due yet not claimed just now (its group is busy): the poll interval.
        return min(poll, ahead) if ahead > 0 else poll

    def _listen_loop(self) -> None:
        conninfo = self.engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        while not self.stop.is_set():
            try:
                self._listen(conninfo)
            except Exception as exc:
                log.warning("LISTEN connection lost: %s", exc)
                self.stop.wait(1.0)

    def _listen(self, conninfo: str) -> None:
        """Wake the handler threads on this consumer's NOTIFY, the source on its queues'."""
        import psycopg

        mine = wake_payload(self.consumer)
        queues = set(self.consumer.queues)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(POSTGRESQL.listen(self.consumer.config.notify_channel))
            while not self.stop.is_set():
                for note in conn.notifies(timeout=0.5):
                    if note.payload == mine:  # a head promoted elsewhere (unblock, a peer)
                        self._promoted()
                    elif note.payload in queues:
                        self.source.wake()

    # --- helpers ----------------------------------------------------------------------------

    def _ingested(self, result: IngestResult) -> None:
        if result.duplicates:
            with self._lock:
                self.duplicates += result.duplicates
            # Counted per consumer: one ingest batch mixes queues and priorities.
            metrics.default().duplicate(self.consumer.name, "", 0, result.duplicates)
        if result.inserted:
            self.claimer.look_back()
            self.claim_wake.set()

    def _promoted(self) -> None:
        """A group's head became ready: behind the claimer's positions, as its seq is old."""
        self.claimer.look_back()
        self.claim_wake.set()

    def full_head_pass(self) -> int:
        return self.heads.head_pass(full=True)

    def _safely(self, action: Any) -> Any:
        try:
            return action()
        except Exception as exc:
            log.warning("%s failed: %s", getattr(action, "__name__", action), exc)
            return None


def _nothing() -> None:
    pass


@dataclass
class _Schedule:
    """When the supervising loop last did what (``time.monotonic()``)."""

    started: float
    options: WorkerOptions
    last_pass: float = 0.0
    last_full_pass: float = 0.0
    last_idle_check: float = 0.0
    idle_seen: int = 0

    def __post_init__(self) -> None:
        self.last_pass = self.last_idle_check = self.started
        self.last_full_pass = self.started - self.options.full_head_pass_interval  # at start

    @property
    def quiet(self) -> float:
        return max(0.5, self.options.poll_interval)
