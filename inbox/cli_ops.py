"""``outbox inbox failed | prune | groups`` (registered on ``inbox_group``; retry and unblock
are in ``inbox.cli_repair``).

Every option reads an environment variable; listing commands have ``--json``; progress bars
go to stderr (a bar on a terminal, the label once otherwise) so ``--json`` stays parseable;
errors are printed with passwords masked. The work is in ``inbox.ops``.
"""

from __future__ import annotations

import json
import sys

import click

from inbox.cli_options import consumer_option, group_option, opt, type_option
from inbox.ops import admin
from inbox.ops.groups import blocked_groups
from outbox.clock import utcnow
from outbox.ops.cli_common import (
    db_options,
    echo_json,
    fail,
    json_option,
    open_config,
    since_option,
    table,
)
from outbox.ops.parse import format_age, parse_duration


def _first_line(text: str | None, width: int = 80) -> str:
    return text.splitlines()[0][:width] if text else ""


@click.command("failed")
@db_options
@consumer_option
@type_option
@group_option
@opt("--error-like", "OUTBOX_ERROR_LIKE", "Only rows whose last_error contains this text.")
@opt("--since", "OUTBOX_SINCE", "Only rows that died since: a duration back (2h, 7d) or ISO time.")
@opt(
    "--limit", "OUTBOX_LIMIT", "At most this many rows.", default=100, show_default=True,
    type=click.IntRange(1, 100000),
)  # fmt: skip
@opt(
    "--show", "OUTBOX_INBOX_SHOW",
    "Show one inbox row whole: payload, headers, attempts, last_error, event_id, consumer, "
    "group.", "show_id", type=int,
)  # fmt: skip
@json_option
def failed_cmd(
    dsn: str,
    outbox_table: str,
    inbox_table: str,
    consumer: str | None,
    type_: str | None,
    group: str | None,
    error_like: str | None,
    since: str | None,
    limit: int,
    show_id: int | None,
    as_json: bool,
) -> None:
    """List dead inbox rows (failed, and halted: dead and holding their group), oldest
    first, or show one row with --show ID.

    \b
    Exit codes: 0 printed (even an empty list), 1 the database could not be read or the
    --show row does not exist, 2 bad option.
    """
    since_at = since_option(since)
    engine, config = open_config(dsn, outbox_table, inbox_table)
    try:
        if show_id is not None:
            row = admin.show(engine, show_id, config=config)
        else:
            rows = admin.list_failed(
                engine, config=config, consumer=consumer, type_=type_, group=group,
                error_like=error_like, since=since_at, limit=limit,
            )  # fmt: skip
    except Exception as exc:
        fail(f"inbox failed: {exc}")
    finally:
        engine.dispose()
    if show_id is not None:
        if row is None:
            fail(f"no inbox row with id {show_id}")
        if as_json:
            echo_json(row)
            return
        for key, value in row.items():
            if isinstance(value, (dict, list)):
                value = json.dumps(value, indent=2, sort_keys=True)
            click.echo(f"{key}: {value}")
        return
    if as_json:
        echo_json(rows)
        return
    table(
        ["ID", "CONSUMER", "GROUP", "TYPE", "STATE", "ATTEMPTS", "DIED", "LAST ERROR"],
        [
            [str(r["id"]), r["consumer"], r["serial_group"] or "-", r["type"], r["state"],
             str(r["attempts"]), str(r["finished_at"] or "")[:19], _first_line(r["last_error"])]
            for r in rows
        ],
    )  # fmt: skip
    click.echo(f"{len(rows)} dead row(s)" + (" (limit reached)" if len(rows) == limit else ""))


@click.command("prune")
@db_options
@opt(
    "--older-than", "OUTBOX_INBOX_PRUNE_OLDER_THAN",
    "Delete done rows finished longer ago than this (30d, 12h, 2w).", required=True,
)  # fmt: skip
@consumer_option
@opt(
    "--batch", "OUTBOX_INBOX_PRUNE_BATCH", "Rows per delete transaction.", default=10000,
    show_default=True, type=click.IntRange(1, admin.MAX_PRUNE_BATCH),
)  # fmt: skip
@opt("--dry-run", "OUTBOX_DRY_RUN", "Count what would be deleted; delete nothing.", is_flag=True)
@json_option
def prune_cmd(
    dsn: str,
    outbox_table: str,
    inbox_table: str,
    older_than: str,
    consumer: str | None,
    batch: int,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete done inbox rows finished before --older-than, in short batches. Never failed,
    halted or unfinished rows.

    Retention: the done row of (event_id, consumer) is what makes a redelivery a duplicate.
    Keep it at least as long as a copy of the message can still arrive: the broker's longest
    redelivery window (RabbitMQ message TTL, Kafka retention.ms) plus the retry window (how
    long a failed outbox row may wait for `outbox retry` and be published again). Pruned
    sooner, a late duplicate runs its handler a second time.

    Each batch is its own transaction (ids first, then DELETE ... WHERE id IN): safe from
    cron while workers run. Prints the rows deleted and the rate.

    \b
    Exit codes: 0 done (also when nothing was old enough), 1 the database failed,
    2 bad option.
    """
    try:
        before = utcnow() - parse_duration(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    engine, config = open_config(dsn, outbox_table, inbox_table)
    try:
        total = admin.count_prunable(engine, before, consumer=consumer, config=config)
        if not dry_run:
            with click.progressbar(length=total, label="pruning", file=sys.stderr) as bar:
                result = admin.prune(
                    engine, before, consumer=consumer, batch=batch, config=config,
                    progress=bar.update,
                )  # fmt: skip
    except Exception as exc:
        fail(f"inbox prune failed: {exc}")
    finally:
        engine.dispose()
    scope = f" of consumer {consumer!r}" if consumer else ""
    if dry_run:
        if as_json:
            echo_json({"dry_run": True, "would_delete": total, "before": before.isoformat()})
        else:
            cutoff = before.isoformat(timespec="seconds")
            click.echo(f"would delete {total} done row(s){scope} finished before {cutoff}")
        return
    if as_json:
        echo_json(
            {
                "dry_run": False, "deleted": result.deleted, "batches": result.batches,
                "seconds": round(result.seconds, 3),
                "rows_per_second": round(result.rows_per_second, 1),
                "before": before.isoformat(), "groups_forgotten": result.groups_forgotten,
            }
        )  # fmt: skip
        return
    click.echo(
        f"deleted {result.deleted} done row(s){scope} older than {older_than} in "
        f"{result.batches} batch(es), {result.seconds:.2f}s, {result.rows_per_second:.0f} rows/s;"
        f" {result.groups_forgotten} idle group row(s) forgotten"
    )


@click.command("groups")
@db_options
@consumer_option
@opt(
    "--limit", "OUTBOX_LIMIT", "At most this many groups.", default=100, show_default=True,
    type=click.IntRange(1, 100000),
)  # fmt: skip
@json_option
def groups_cmd(
    dsn: str, outbox_table: str, inbox_table: str, consumer: str | None, limit: int, as_json: bool
) -> None:
    """Serial groups that are blocked or waiting, longest-held first: the row everyone
    waits for (the head: id, type, priority, state), why, and how many rows wait (ready,
    waiting, or still in the outbox).

    \b
    Why is one of:
      halted by dead message N          retry N or `outbox inbox unblock GROUP`
      head is processing since T        (lease expired at L: its worker died)
      waiting behind retry N due at T   (judged as under on_retry="block")
      retry N is due since T            waiting for a worker
      waiting for outbox row N          ahead in the group, not delivered yet
      waiting: head not yet promoted    the head-of-group pass does it
      head N is ready                   waiting for a worker

    \b
    When the database also holds the outbox, a group whose rows are all still pending
    there (no consumer has received them: no relay or database-source worker running, or
    stored with a delay) is listed once, with CONSUMER "-" (null in --json): "waiting for
    outbox row N: not delivered to any consumer yet" (or "not due until T").

    \b
    Exit codes: 0 printed (even an empty list), 1 the database could not be read,
    2 bad option.
    """
    engine, config = open_config(dsn, outbox_table, inbox_table)
    now = utcnow()
    try:
        reports = blocked_groups(engine, now=now, consumer=consumer, limit=limit, config=config)
    except Exception as exc:
        fail(f"inbox groups failed: {exc}")
    finally:
        engine.dispose()
    if as_json:
        echo_json([r.as_dict() for r in reports])
        return
    rows = []
    for r in reports:
        h = r.head or {}
        rows.append(
            [r.consumer or "-", r.group, str(h.get("id", "-")), str(h.get("state", "-")),
             str(h.get("priority", "-")), str(h.get("type", "-")), str(r.in_line),
             format_age((now - r.since).total_seconds()), r.why]
        )  # fmt: skip
    table(["CONSUMER", "GROUP", "HEAD", "STATE", "PRIO", "TYPE", "WAITING", "HELD", "WHY"], rows)
    click.echo(f"{len(reports)} group(s)" + (" (limit reached)" if len(reports) == limit else ""))


commands: list[click.Command] = [failed_cmd, prune_cmd, groups_cmd]
