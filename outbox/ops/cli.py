"""Operator commands: ``outbox metrics | stats | failed | retry | compact | check``.

Registered on the ``outbox`` group by ``outbox_cli.main``. Every option reads an environment
variable; output that lists has ``--json``; progress bars go to stderr so ``--json`` output
stays parseable; every URL printed is masked.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from prometheus_client import CollectorRegistry, generate_latest

from outbox.clock import utcnow
from outbox.metrics import DatabaseGauges
from outbox.ops import admin, cli_repair
from outbox.ops.check import BROKER_TIMEOUT, check_broker, check_database
from outbox.ops.cli_common import (
    Database,
    DeadTable,
    Listing,
    database_options,
    database_work,
    echo_dead,
    echo_json,
    env_option,
    fail,
    first_line,
    json_option,
    listing_options,
    queue_type_options,
    since_option,
    table,
)
from outbox.ops.parse import format_age


@click.command("metrics")
@database_options
@env_option(
    "--once", "OUTBOX_METRICS_ONCE", is_flag=True, required=True,
    help="Print the database-derived metrics once in Prometheus text format and exit.",
)  # fmt: skip
def metrics_cmd(db: Database, once: bool) -> None:
    """Print the database gauges (pending, lag, failed, inbox states) once.

    Counters and histograms live in the relay and worker processes: scrape their
    --metrics-port for those.

    Exit codes: 0 printed, 1 the database could not be read.
    """
    engine, schema = db.open()
    registry = CollectorRegistry()
    # Every consumer of the inbox, at 0 when all its work is done: a consumer missing from
    # the output would read as "unknown" rather than "idle".
    gauges = DatabaseGauges(
        engine, schema, refresh_interval=0, log_errors=False, every_consumer=True
    )
    registry.register(gauges)
    text = generate_latest(registry).decode()
    engine.dispose()
    if gauges.last_error is not None:
        fail(f"cannot read the database: {gauges.last_error}")
    click.echo(text, nl=False)


@click.command("stats")
@database_options
@json_option
def stats_cmd(db: Database, as_json: bool) -> None:
    """Per queue/priority: pending, oldest due pending age, failed, sent in the last hour.
    Per consumer: waiting, processing, failed, duplicates absorbed, longest-blocked group.

    \b
    Exit codes: 0 printed, 1 the database could not be read.
    """
    engine, schema = db.open()
    with database_work(engine, "stats"):
        result = admin.stats(engine, schema, utcnow())
    if as_json:
        echo_json(result.as_dict())
        return
    click.echo("outbox")
    table(
        ["QUEUE", "PRIO", "PENDING", "OLDEST", "FAILED", "SENT/1h"],
        [
            [s.queue, str(s.priority), str(s.pending), format_age(s.oldest_pending_seconds),
             str(s.failed), str(s.sent_last_hour)]
            for s in result.queues
        ],
    )  # fmt: skip
    click.echo("\ninbox")
    table(
        ["CONSUMER", "WAITING", "PROCESSING", "FAILED", "DUPLICATES", "BLOCKED"],
        [
            [c.consumer, str(c.waiting), str(c.processing), str(c.failed), str(c.duplicates),
             format_age(c.longest_blocked_seconds)]
            for c in result.consumers
        ],
    )  # fmt: skip


@click.command("failed")
@database_options
@queue_type_options
@listing_options(
    "Only rows stored since: a duration back from now (2h, 7d) or an ISO time.",
    "OUTBOX_SHOW",
    "Show one row whole: payload, headers, attempts, last_error.",
)
def failed_cmd(db: Database, queue: str | None, type_: str | None, listing: Listing) -> None:
    """List dead-lettered outbox rows (oldest first), or show one with --show ID.

    \b
    Exit codes: 0 printed (even an empty list), 1 the database could not be read or the
    --show row does not exist, 2 bad option.
    """
    since_at = since_option(listing.since)
    engine, schema = db.open()
    echo_dead(
        engine, _FAILED, listing,
        lambda row_id: admin.show(engine, schema, row_id),
        lambda: admin.list_failed(
            engine, schema, queue=queue, type_=type_, error_like=listing.error_like,
            since=since_at, limit=listing.limit,
        ),
    )  # fmt: skip


def _failed_cells(r: dict[str, Any]) -> list[str]:
    return [
        str(r["id"]), r["queue"], str(r["priority"]), r["type"], str(r["attempts"]),
        str(r["occurred_at"])[:19], first_line(r["last_error"]),
    ]  # fmt: skip


_FAILED = DeadTable(
    "failed", "outbox", ["ID", "QUEUE", "PRIO", "TYPE", "ATTEMPTS", "OCCURRED", "LAST ERROR"],
    _failed_cells, "failed row(s)",
)  # fmt: skip


@click.command("check")
@database_options
@env_option(
    "--broker",
    "OUTBOX_BROKER",
    default="",
    help="Also check this broker accepts a connection (amqp://... or kafka://...).",
)
@env_option(
    "--timeout", "OUTBOX_CHECK_TIMEOUT", default=BROKER_TIMEOUT, show_default=True,
    type=click.FloatRange(0.1, 120), help="Seconds for the broker check.",
)  # fmt: skip
@json_option
def check_cmd(db: Database, broker: str, timeout: float, as_json: bool) -> None:
    """Health check: database reachable, schema at the latest migration, indexes present,
    broker reachable (with --broker). For probes and deploy scripts.

    \b
    Exit codes: 0 every check passed, 1 at least one failed (each is printed), 2 usage.
    """
    engine, schema = db.open()
    try:
        results = check_database(engine, schema)
    finally:
        engine.dispose()
    if broker:
        results.append(check_broker(broker, timeout))
    if as_json:
        echo_json([{"check": r.name, "ok": r.ok, "detail": r.detail} for r in results])
    else:
        for r in results:
            click.echo(f"{'ok  ' if r.ok else 'FAIL'}  {r.name}: {r.detail}")
    if not all(r.ok for r in results):
        sys.exit(1)


commands: list[click.Command] = [
    metrics_cmd, stats_cmd, failed_cmd, *cli_repair.commands, check_cmd,
]  # fmt: skip
