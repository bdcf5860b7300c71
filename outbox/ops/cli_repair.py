"""Operator commands that change rows: ``outbox retry``, ``republish`` and ``compact``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from sqlalchemy import Engine

from outbox.clock import utcnow
from outbox.ops import admin
from outbox.ops.cli_common import (
    audit_actor,
    audit_options,
    db_options,
    echo_json,
    fail,
    json_option,
    open_db,
    queue_type_options,
    retry_request,
    since_option,
)
from outbox.ops.parse import parse_duration


@click.command("retry")
@db_options
@click.option(
    "--id", "ids", envvar="OUTBOX_RETRY_IDS", show_envvar=True, multiple=True, type=int,
    help="Retry this failed row (repeat; the env var takes space-separated ids).",
)  # fmt: skip
@click.option(
    "--all", "all_", envvar="OUTBOX_RETRY_ALL", show_envvar=True, is_flag=True,
    help="Retry every failed row (narrow with --queue/--type).",
)  # fmt: skip
@queue_type_options
@click.option(
    "--dry-run", envvar="OUTBOX_DRY_RUN", show_envvar=True, is_flag=True,
    help="Show which rows would be retried; change nothing.",
)  # fmt: skip
@audit_options
@json_option
def retry_cmd(
    dsn: str,
    outbox_table: str,
    inbox_table: str,
    ids: tuple[int, ...],
    all_: bool,
    queue: str | None,
    type_: str | None,
    dry_run: bool,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Put failed outbox rows back to pending: attempts reset, due now, one audit record.

    Only rows in status failed are touched; the relay publishes them on its next pass.

    \b
    Exit codes: 0 done (or nothing matched --all), 1 an --id was not a failed row (the
    others were still retried) or the database failed, 2 usage error (neither or both of
    --id and --all, empty --reason).
    """
    who = retry_request(ids, all_, reason, actor)

    def call(dry: bool, progress: Callable[[int], None]) -> admin.RetryResult:
        return admin.retry(
            engine, schema, now=utcnow(), reason=reason, actor=who,
            ids=list(ids) if ids else None, queue=queue, type_=type_, dry_run=dry,
            progress=progress,
        )  # fmt: skip

    engine, schema = open_db(dsn, outbox_table, inbox_table)
    _requeue(engine, call, RETRY, dry_run, as_json, who, reason, {})


@click.command("republish")
@db_options
@click.option(
    "--id", "ids", envvar="OUTBOX_REPUBLISH_IDS", show_envvar=True, multiple=True, type=int,
    help="Republish this sent row (repeat; the env var takes space-separated ids).",
)  # fmt: skip
@click.option(
    "--sent-since", envvar="OUTBOX_SENT_SINCE", show_envvar=True,
    help="Republish the rows sent since this time (2h, or 2026-11-30T03:00 UTC).",
)  # fmt: skip
@click.option(
    "--sent-until", envvar="OUTBOX_SENT_UNTIL", show_envvar=True,
    help="With --sent-since: only rows sent before this time.",
)  # fmt: skip
@queue_type_options
@click.option(
    "--dry-run", envvar="OUTBOX_DRY_RUN", show_envvar=True, is_flag=True,
    help="Show which rows would be republished; change nothing.",
)  # fmt: skip
@audit_options
@json_option
def republish_cmd(
    dsn: str,
    outbox_table: str,
    inbox_table: str,
    ids: tuple[int, ...],
    sent_since: str | None,
    sent_until: str | None,
    queue: str | None,
    type_: str | None,
    dry_run: bool,
    reason: str,
    actor: str | None,
    as_json: bool,
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
    who = audit_actor(reason, actor)
    if since is not None and until is not None and not as_json:
        click.echo(f"window: sent from {since.isoformat()} to {until.isoformat()} (UTC)")

    def call(dry: bool, progress: Callable[[int], None]) -> admin.RetryResult:
        return admin.republish(
            engine, schema, now=utcnow(), reason=reason, actor=who,
            ids=list(ids) if ids else None, sent_since=since, sent_until=until,
            queue=queue, type_=type_, dry_run=dry, progress=progress,
        )  # fmt: skip

    engine, schema = open_db(dsn, outbox_table, inbox_table)
    window = (
        {"sent_since": since.isoformat(), "sent_until": until.isoformat()}
        if since is not None and until is not None
        else {}
    )
    _requeue(engine, call, REPUBLISH, dry_run, as_json, who, reason, window)


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
    call: Callable[[bool, Callable[[int], None]], admin.RetryResult],
    verb: Verb,
    dry_run: bool,
    as_json: bool,
    who: str,
    reason: str,
    extra: dict[str, Any],
) -> None:
    """Run a retry or republish (a dry run first: it is --dry-run's answer and gives the
    progress bar its length), print what it did, exit 1 if some --id did not match."""
    try:
        result = call(True, lambda _n: None)
        if not dry_run and result.ids:
            with click.progressbar(
                length=len(result.ids), label=verb.doing, file=sys.stderr
            ) as bar:
                result = call(False, bar.update)
    except Exception as exc:
        fail(f"{verb.name} failed: {exc}")
    finally:
        engine.dispose()
    if as_json:
        echo_json(
            {"ids": result.ids, f"not_{verb.status}": result.not_matched, "dry_run": dry_run,
             "by": who, **extra}
        )  # fmt: skip
    else:
        shown = " ".join(str(i) for i in result.ids[:50])
        more = " ..." if len(result.ids) > 50 else ""
        done = f"would {verb.name}" if dry_run else verb.past
        click.echo(f"{done} {len(result.ids)} row(s){': ' + shown + more if shown else ''}")
        if result.ids and not dry_run:
            click.echo(f"audit: {verb.name} by {who}: {reason}")
    if result.not_matched:
        click.echo(
            f"error: not {verb.past} (no such row, not {verb.status}, or outside the filters): "
            + " ".join(str(i) for i in result.not_matched),
            err=True,
        )
        sys.exit(1)


@click.command("compact")
@db_options
@click.option(
    "--older-than", envvar="OUTBOX_COMPACT_OLDER_THAN", show_envvar=True, required=True,
    help="Delete sent rows sent longer ago than this (7d, 12h, 2w).",
)  # fmt: skip
@click.option(
    "--batch", envvar="OUTBOX_COMPACT_BATCH", show_envvar=True, default=10000,
    show_default=True, type=click.IntRange(1, admin.MAX_COMPACT_BATCH),
    help="Rows per delete transaction.",
)  # fmt: skip
@json_option
def compact_cmd(
    dsn: str, outbox_table: str, inbox_table: str, older_than: str, batch: int, as_json: bool
) -> None:
    """Delete old sent outbox rows in short batches; never pending or failed rows.

    Safe to run from cron while the relay and producers work: each batch is its own
    transaction. Prints the rows deleted and the rate.

    \b
    Exit codes: 0 done (also when nothing was old enough), 1 the database failed,
    2 bad option.
    """
    try:
        age = parse_duration(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    engine, schema = open_db(dsn, outbox_table, inbox_table)
    before = utcnow() - age
    try:
        total = admin.count_compactable(engine, schema, before)
        with click.progressbar(length=total, label="compacting", file=sys.stderr) as bar:
            result = admin.compact(engine, schema, before=before, batch=batch, progress=bar.update)
    except Exception as exc:
        fail(f"compact failed: {exc}")
    finally:
        engine.dispose()
    if as_json:
        echo_json(
            {
                "deleted": result.deleted,
                "batches": result.batches,
                "seconds": round(result.seconds, 3),
                "rows_per_second": round(result.rows_per_second, 1),
                "before": before.isoformat(),
            }
        )
    else:
        click.echo(
            f"deleted {result.deleted} sent row(s) older than {older_than} in "
            f"{result.batches} batch(es), {result.seconds:.2f}s, "
            f"{result.rows_per_second:.0f} rows/s"
        )


commands: list[click.Command] = [retry_cmd, republish_cmd, compact_cmd]
