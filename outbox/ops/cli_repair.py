"""Operator commands that change rows: ``outbox retry``, ``republish`` and ``compact``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from sqlalchemy import Engine

from outbox.clock import utcnow
from outbox.ops import admin
from outbox.ops.cli_common import (
    Change,
    Database,
    all_option,
    change_options,
    database_options,
    database_work,
    delete_with_bar,
    deleted_json,
    deleted_line,
    echo_ids,
    echo_json,
    env_option,
    exit_not_matched,
    ids_option,
    json_option,
    older_than_option,
    queue_type_options,
    requeue_with_bar,
    retry_request,
    since_option,
)
from outbox.ops.core import Progress


@click.command("retry")
@database_options
@ids_option(
    "OUTBOX_RETRY_IDS", "Retry this failed row (repeat; the env var takes space-separated ids)."
)
@all_option("OUTBOX_RETRY_ALL", "Retry every failed row (narrow with --queue/--type).")
@queue_type_options
@change_options("Show which rows would be retried; change nothing.")
def retry_cmd(
    db: Database,
    ids: tuple[int, ...],
    all_: bool,
    queue: str | None,
    type_: str | None,
    change: Change,
) -> None:
    """Put failed outbox rows back to pending: attempts reset, due now, one audit record.

    Only rows in status failed are touched; the relay publishes them on its next pass.

    \b
    Exit codes: 0 done (or nothing matched --all), 1 an --id was not a failed row (the
    others were still retried) or the database failed, 2 usage error (neither or both of
    --id and --all, empty --reason).
    """
    who = retry_request(ids, all_, change)

    def call(dry: bool, progress: Progress) -> admin.RetryResult:
        return admin.retry(
            engine, schema, now=utcnow(), reason=change.reason, actor=who,
            ids=list(ids) if ids else None, queue=queue, type_=type_, dry_run=dry,
            progress=progress,
        )  # fmt: skip

    engine, schema = db.open()
    _requeue(engine, call, RETRY, change, who, {})


@click.command("republish")
@database_options
@ids_option(
    "OUTBOX_REPUBLISH_IDS",
    "Republish this sent row (repeat; the env var takes space-separated ids).",
)
@env_option(
    "--sent-since",
    "OUTBOX_SENT_SINCE",
    help="Republish the rows sent since this time (2h, or 2026-11-30T03:00 UTC).",
)
@env_option(
    "--sent-until", "OUTBOX_SENT_UNTIL", help="With --sent-since: only rows sent before this time."
)  # fmt: skip
@queue_type_options
@change_options("Show which rows would be republished; change nothing.")
def republish_cmd(
    db: Database,
    ids: tuple[int, ...],
    sent_since: str | None,
    sent_until: str | None,
    queue: str | None,
    type_: str | None,
    change: Change,
) -> None:
    """Put sent outbox rows back to pending, so the relay publishes them again.

    For messages a broker lost after confirming them: a queue deleted or purged, a Kafka
    topic's retention run out, a broker that lost its disk. In a job-queue deployment the
    later messages of their serial groups wait for them (up to the consumer's delivery
    window); this lets them go on. A consumer that still has a message in its inbox counts
    a duplicate and does not run it again; one whose inbox row was pruned (`outbox inbox
    prune`) runs it again: republish only what is younger than your inbox retention.
    Pointless with the database source (nothing is lost between outbox and inbox).

    The window is [--sent-since, --sent-until), --sent-until defaulting to now; the resolved
    times are printed. Prefer absolute times: a row republished and sent again gets a new
    sent time, so an open window run twice takes it twice (harmless, duplicates). Order: a
    republished row is published after the later rows of its key sent meanwhile.

    \b
    Exit codes: 0 done (or nothing sent in the window), 1 an --id was not a sent row (the
    others were still republished) or the database failed, 2 usage error (neither or both
    of --id and --sent-since, --sent-until without --sent-since or not after it, empty
    --reason).
    """
    sent_since, sent_until = sent_since or None, sent_until or None  # empty env var = unset
    if bool(ids) == (sent_since is not None):
        raise click.UsageError("give either --id ID... or --sent-since WHEN")
    if sent_until is not None and sent_since is None:
        raise click.UsageError("--sent-until goes with --sent-since")
    since = since_option(sent_since, "--sent-since")
    until = since_option(sent_until, "--sent-until") or (utcnow() if since else None)
    if since is not None and until is not None and until <= since:
        raise click.BadParameter(
            f"{until.isoformat()} is not after --sent-since {since.isoformat()}",
            param_hint="--sent-until",
        )
    who = change.who()
    if since is not None and until is not None and not change.as_json:
        click.echo(f"window: sent from {since.isoformat()} to {until.isoformat()} (UTC)")

    def call(dry: bool, progress: Progress) -> admin.RetryResult:
        return admin.republish(
            engine, schema, now=utcnow(), reason=change.reason, actor=who,
            ids=list(ids) if ids else None, sent_since=since, sent_until=until,
            queue=queue, type_=type_, dry_run=dry, progress=progress,
        )  # fmt: skip

    engine, schema = db.open()
    window = (
        {"sent_since": since.isoformat(), "sent_until": until.isoformat()}
        if since is not None and until is not None
        else {}
    )
    _requeue(engine, call, REPUBLISH, change, who, window)


@dataclass(frozen=True)
class Verb:
    name: str  # retry
    past: str  # retried
    doing: str  # retrying
    status: str  # the status the command takes rows from


RETRY = Verb("retry", "retried", "retrying", "failed")
REPUBLISH = Verb("republish", "republished", "republishing", "sent")


def _requeue(
    engine: Engine,
    call: Callable[[bool, Progress], admin.RetryResult],
    verb: Verb,
    change: Change,
    who: str,
    extra: dict[str, Any],
) -> None:
    """Run a retry or republish (a dry run first: it is --dry-run's answer and gives the
    progress bar its length), print what it did, exit 1 if some --id did not match."""
    dry_run = change.dry_run
    with database_work(engine, verb.name):
        result = requeue_with_bar(call, dry_run, verb.doing)
    if change.as_json:
        echo_json(
            {"ids": result.ids, f"not_{verb.status}": result.not_matched, "dry_run": dry_run,
             "by": who, **extra}
        )  # fmt: skip
    else:
        echo_ids(f"would {verb.name}" if dry_run else verb.past, result.ids)
        if result.ids and not dry_run:
            click.echo(f"audit: {verb.name} by {who}: {change.reason}")
    exit_not_matched(verb.past, verb.status, result.not_matched)


@click.command("compact")
@database_options
@env_option(
    "--older-than",
    "OUTBOX_COMPACT_OLDER_THAN",
    required=True,
    help="Delete sent rows sent longer ago than this (7d, 12h, 2w).",
)
@env_option(
    "--batch", "OUTBOX_COMPACT_BATCH", default=admin.COMPACT_BATCH, show_default=True,
    type=click.IntRange(1, admin.MAX_COMPACT_BATCH), help="Rows per delete transaction.",
)  # fmt: skip
@json_option
def compact_cmd(db: Database, older_than: str, batch: int, as_json: bool) -> None:
    """Delete old sent outbox rows in short batches; never pending or failed rows.

    Safe to run from cron while the relay and producers work: each batch is its own
    transaction. Prints the rows deleted and the rate.

    \b
    Exit codes: 0 done (also when nothing was old enough), 1 the database failed,
    2 bad option.
    """
    before = older_than_option(older_than)
    engine, schema = db.open()
    with database_work(engine, "compact"):
        total = admin.count_compactable(engine, schema, before)
        result = delete_with_bar(
            total, "compacting",
            lambda bar: admin.compact(engine, schema, before=before, batch=batch, progress=bar),
        )  # fmt: skip
    if as_json:
        echo_json(deleted_json(result, before))
    else:
        click.echo(deleted_line("sent row(s)", older_than, result))


commands: list[click.Command] = [retry_cmd, republish_cmd, compact_cmd]
