"""Operator commands that change rows: ``outbox retry`` and ``outbox compact``."""

from __future__ import annotations

import sys

import click

from outbox.clock import utcnow
from outbox.ops import admin
from outbox.ops.cli_common import db_options, echo_json, fail, json_option, open_db, retry_request
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
@click.option("--queue", envvar="OUTBOX_QUEUE", show_envvar=True, help="Only this queue.")
@click.option("--type", "type_", envvar="OUTBOX_TYPE", show_envvar=True, help="Only this type.")
@click.option(
    "--dry-run", envvar="OUTBOX_DRY_RUN", show_envvar=True, is_flag=True,
    help="Show which rows would be retried; change nothing.",
)  # fmt: skip
@click.option(
    "--reason", envvar="OUTBOX_REASON", show_envvar=True, required=True,
    help="Why (kept in the audit table with who and when).",
)  # fmt: skip
@click.option(
    "--by", "actor", envvar="OUTBOX_ACTOR", show_envvar=True, default=None,
    help="Who, for the audit record. Default: the OS user.",
)  # fmt: skip
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
    engine, schema = open_db(dsn, outbox_table, inbox_table)
    try:
        # The dry run first: it is --dry-run's answer, and gives the bar its length.
        result = admin.retry(
            engine, schema, now=utcnow(), reason=reason, actor=who,
            ids=list(ids) if ids else None, queue=queue, type_=type_, dry_run=True,
        )  # fmt: skip
        if not dry_run and result.ids:
            with click.progressbar(
                length=len(result.ids), label="retrying", file=sys.stderr
            ) as bar:
                result = admin.retry(
                    engine, schema, now=utcnow(), reason=reason, actor=who,
                    ids=list(ids) if ids else None, queue=queue, type_=type_,
                    progress=bar.update,
                )  # fmt: skip
    except Exception as exc:
        fail(f"retry failed: {exc}")
    finally:
        engine.dispose()
    if as_json:
        echo_json(
            {"ids": result.ids, "not_failed": result.not_failed, "dry_run": dry_run, "by": who}
        )
    else:
        verb = "would retry" if dry_run else "retried"
        shown = " ".join(str(i) for i in result.ids[:50])
        more = " ..." if len(result.ids) > 50 else ""
        click.echo(f"{verb} {len(result.ids)} row(s){': ' + shown + more if shown else ''}")
        if result.ids and not dry_run:
            click.echo(f"audit: retry by {who}: {reason}")
    if result.not_failed:
        click.echo(
            "error: not retried (no such row, not failed, or outside --queue/--type): "
            + " ".join(str(i) for i in result.not_failed),
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


commands: list[click.Command] = [retry_cmd, compact_cmd]
