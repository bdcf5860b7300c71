"""``outbox worker`` and ``outbox inbox ...`` (registered on the ``outbox`` group by
outbox_cli.main)."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import TYPE_CHECKING

import click

from inbox.settings import (
    ISOLATIONS,
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    POLL_INTERVAL_RANGE,
    Isolation,
    WorkerOptions,
)
from outbox import dsn as dsn_mod
from outbox.cli_groups import LazyGroup
from outbox.cli_support import dsn_option, env_option, metrics_options, option_stack, queues_option
from outbox.cli_support import fail as _fail
from outbox.errors import OutboxError
from outbox.logs import configure_logging, log_options

if TYPE_CHECKING:
    from inbox.consumer import Consumer

commands: list[click.Command] = []


def load_consumer(target: str) -> Consumer:
    """``package.module:attribute`` -> the Consumer. The path comes from the operator's
    command line, never from message data."""
    from inbox.consumer import Consumer

    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter("expected MODULE:CONSUMER, e.g. myapp.jobs:consumer")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the operator's project is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from exc
    consumer = getattr(module, attribute, None)
    if not isinstance(consumer, Consumer):
        raise click.BadParameter(f"{target!r} is not an inbox.Consumer")
    return consumer


_WORKER_OPTIONS = option_stack(
    dsn_option,
    env_option(
        "--source", "OUTBOX_SOURCE", default="",
        help="Broker URL (amqp://... or kafka://...); empty: take messages from the database.",
    ),
    queues_option(
        "OUTBOX_WORKER_QUEUES",
        "Receive only these of the consumer's queues (repeat; env: space-separated). "
        "Default: all of them.",
    ),
    env_option(
        "--concurrency", "OUTBOX_CONCURRENCY", default=WorkerOptions.concurrency,
        show_default=True, type=click.IntRange(1, MAX_CONCURRENCY),
        help="Handler threads in this process.",
    ),
    env_option(
        "--batch-size", "OUTBOX_WORKER_BATCH_SIZE", default=WorkerOptions.batch_size,
        show_default=True, type=click.IntRange(1, MAX_BATCH_SIZE),
        help="Handlers per database transaction: each handler thread claims up to this many "
        "messages at once and commits their effects and done marks together (1: one "
        "transaction per message). See docs/batches.md.",
    ),
    env_option(
        "--batch-isolation", "OUTBOX_BATCH_ISOLATION", default=WorkerOptions.isolation,
        show_default=True, type=click.Choice(ISOLATIONS),
        help="When a handler raises: 'rerun' rolls the batch back and runs it again without "
        "that message; 'savepoint' wraps each handler in a SAVEPOINT (no re-runs, two more "
        "round trips per message).",
    ),
    env_option(
        "--batch-seconds", "OUTBOX_BATCH_SECONDS", default=WorkerOptions.batch_seconds,
        show_default=True, type=click.FloatRange(min=0, min_open=True),
        help="A batch whose handlers have run this long commits what is done; the rest of it "
        "runs in the next transaction.",
    ),
    env_option(
        "--poll-interval", "OUTBOX_WORKER_POLL_INTERVAL", default=WorkerOptions.poll_interval,
        show_default=True, type=click.FloatRange(*POLL_INTERVAL_RANGE),
        help="Seconds between looks when idle (PostgreSQL also wakes on NOTIFY).",
    ),
    env_option(
        "--stop-when-idle", "OUTBOX_STOP_WHEN_IDLE", is_flag=True,
        help="Exit 0 once nothing is left to receive, run or retry.",
    ),
    env_option(
        "--time-limit", "OUTBOX_WORKER_TIME_LIMIT", type=click.FloatRange(min=0, min_open=True),
        default=None, help="Exit 0 after this many seconds (supervisord restarts it).",
    ),
    metrics_options(
        "Serve Prometheus metrics (inbox_processed_total, handler and end-to-end seconds, "
        "duplicates, and the inbox gauges of the database) on this port. Default: no "
        "metrics server."
    ),
    log_options,
)  # fmt: skip


@click.command()
@click.argument("target", metavar="MODULE:CONSUMER")
@_WORKER_OPTIONS
def worker(
    target: str,
    dsn: str,
    source: str,
    queues: tuple[str, ...],
    concurrency: int,
    batch_size: int,
    batch_isolation: Isolation,
    batch_seconds: float,
    poll_interval: float,
    stop_when_idle: bool,
    time_limit: float | None,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str,
    library_log_level: str,
) -> None:
    """Run CONSUMER's handlers: receive, dedupe into the inbox, run each message once.

    SIGTERM lets running handlers finish, then exits 0.
    """
    from inbox.sources import source_from_url
    from inbox.worker import Worker
    from outbox.stop_signals import install_stop_signals

    # The consumer's package logs at our level: its handlers' lines are the operator's own.
    package = target.partition(":")[0].split(".")[0]
    configure_logging(log_level, library_log_level, ours=[package])
    consumer = load_consumer(target)
    unknown = sorted(set(queues) - set(consumer.queues))
    if unknown:
        raise click.BadParameter(
            f"not queues of {consumer.name!r}: {unknown}", param_hint="--queue"
        )
    # Stop signals from the first moment: a SIGTERM during the start-up check (before the
    # worker runs) ends it with 0 like any other, not by the signal's default action, and at
    # once: the check waits for the database on the worker's own stop event.
    stop = threading.Event()
    stops: list[str] = []
    running: list[Worker] = []

    def on_stop(reason: str) -> None:
        stops.append(reason)
        stop.set()
        for started in running:
            started.request_stop(reason)

    uninstall = install_stop_signals(on_stop)
    try:
        # No pre-ping: the loops survive a lost connection (it is invalidated and replaced),
        # and a ping per checkout would double the round trips of a claim.
        engine = dsn_mod.make_engine(dsn, pool_size=concurrency + 4, pool_pre_ping=False)
        config = consumer.config
        chosen = list(queues) or list(consumer.queues)
        src = source_from_url(
            source or None,
            engine=engine,
            queues=chosen,
            priorities=range(config.min_priority, config.max_priority + 1),
            consumer_name=consumer.name,
        )
        if metrics_port is not None:
            from outbox.metrics import serve_process

            serve_process(
                metrics_port, engine, config, host=metrics_host, queues=chosen,
                consumer=consumer.name,
            )  # fmt: skip
        options = WorkerOptions(
            concurrency=concurrency,
            batch_size=batch_size,
            isolation=batch_isolation,
            batch_seconds=batch_seconds,
            poll_interval=poll_interval,
            stop_when_idle=stop_when_idle,
            time_limit=time_limit,
        )
        running.append(Worker(consumer, engine, src, options, broker=bool(source), stop=stop))
        if stops:
            running[0].request_stop(stops[0])
        code = running[0].run(install_signals=False)
    except OutboxError as exc:
        _fail(str(exc))
    finally:
        uninstall()
    engine.dispose()
    sys.exit(code)


# Imported when `outbox inbox ...` runs (outbox/cli_groups.py): `outbox worker` needs none.
@click.group(
    name="inbox",
    cls=LazyGroup,
    lazy={
        "failed": "inbox.cli.ops:failed_cmd",
        "prune": "inbox.cli.ops:prune_cmd",
        "groups": "inbox.cli.ops:groups_cmd",
        "retry": "inbox.cli.repair:retry_cmd",
        "unblock": "inbox.cli.repair:unblock_cmd",
        "review": "inbox.cli.review:review_cmd",
        "resolve": "inbox.cli.review:resolve_cmd",
    },
)
def inbox_group() -> None:
    """Inspect and repair the inbox."""


commands.extend([worker, inbox_group])
