"""What the worker checks before it starts: the inbox tables are there, and whether the
database holds the outbox too (the job-queue deployment); both survive a database that is
not reachable yet.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine, Inspector, inspect
from sqlalchemy.exc import OperationalError

from inbox.consumer import Consumer
from outbox.backoff import outage_delay
from outbox.errors import SchemaError
from outbox.schema import schema_for

log = logging.getLogger("inbox.worker")

# How often the start-up check, while the database has not answered, looks for a stop.
ANSWER_SLICE_SECONDS = 0.05


def brief(exc: BaseException) -> str:
    """The driver's own message: a batch statement with its parameters would fill pages."""
    return str(getattr(exc, "orig", None) or exc).strip()


def require_inbox_tables(inspector: Inspector, consumer: Consumer) -> None:
    """Refuse to start on a database the migrations have not brought to this version: every
    batch would fail at its commit (a missing table) and run its handlers again and again,
    so whatever they do outside the database would be done many times."""
    schema = schema_for(consumer.config)
    missing = [t.name for t in (schema.inbox, schema.groups) if not inspector.has_table(t.name)]
    if missing:
        raise SchemaError(
            f"missing table(s) {', '.join(missing)}: the database schema is older than this "
            "worker. Run `outbox migrate --dsn ...` first (or add the package's migrations to "
            "your own Alembic history)"
        )


def holds_outbox(
    engine: Engine,
    consumer: Consumer,
    time_limit: float | None,
    stop: threading.Event | None = None,
) -> bool | None:
    """Does this database hold the outbox (the job-queue deployment)? Asked at start, with
    the check that the inbox tables are there (``SchemaError`` if not), when a lost
    connection must not end the worker any more than later: tried until it answers, or None
    once the worker's time limit has passed (the relay, too, outlasts an outage within its
    time limit and exits 0), or None as soon as ``stop`` is set (a SIGTERM while the
    database is down, or does not answer, ends the worker at once, with 0)."""
    table = schema_for(consumer.config).outbox.name
    stopped = stop or threading.Event()
    started = time.monotonic()
    deadline = None if time_limit is None else started + time_limit
    failures = 0
    while True:
        try:
            return _ask(engine, consumer, table, stopped, deadline)
        except OperationalError as exc:
            failures += 1
            log.error("database not reachable at start (%s in a row): %s", failures, brief(exc))
            delay = outage_delay(failures)
            if time_limit is not None and time.monotonic() - started + delay > time_limit:
                return None
            if stopped.wait(delay):
                return None


def _ask(
    engine: Engine, consumer: Consumer, table: str, stop: threading.Event, deadline: float | None
) -> bool | None:
    """One attempt, in a thread of its own: a database host that drops packets, or a server
    that takes the connection and never answers, keeps the driver's connect waiting for
    minutes, and neither a stop nor the time limit may wait for it. None: one of them came
    first (the thread is left to its connect: the worker is ending)."""
    outcome: list[bool | BaseException] = []
    answered = threading.Event()

    def ask() -> None:
        try:
            inspector = inspect(engine)
            require_inbox_tables(inspector, consumer)
            outcome.append(inspector.has_table(table))
        except BaseException as exc:  # raised again in the caller's thread, below
            outcome.append(exc)
        finally:
            answered.set()

    threading.Thread(target=ask, name="inbox-start-check", daemon=True).start()
    while not answered.wait(ANSWER_SLICE_SECONDS):
        if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
            return None
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
