"""``outbox inbox failed | prune | groups`` (registered on ``inbox_group``; retry and unblock
are in ``inbox.cli.repair``).

Every option reads an environment variable; listing commands have ``--json``; progress bars
go to stderr (a bar on a terminal, the label once otherwise) so ``--json`` stays parseable;
errors are printed with passwords masked. The work is in ``inbox.ops``.
"""

from __future__ import annotations

from typing import Any

import click

from inbox.cli.options import consumer_option, group_option, type_option
from inbox.ops import admin
from inbox.ops.groups import blocked_groups
from outbox.clock import utcnow
from outbox.ops.cli_common import (
    Database,
    DeadTable,
    Listing,
    counted,
    database_options,
    database_work,
    delete_with_bar,
    deleted_json,
    deleted_line,
    dry_run_option,
    echo_dead,
    echo_json,
    env_option,
    first_line,
    json_option,
    limit_option,
    listing_options,
    older_than_option,
    since_option,
    table,
)
from outbox.ops.parse import format_age


@click.command("failed")
@database_options
@consumer_option
@type_option
@group_option
@listing_options(
    "Only rows that died since: a duration back (2h, 7d) or ISO time.",
    "OUTBOX_INBOX_SHOW",
    "Show one inbox row whole: payload, headers, attempts, last_error, event_id, consumer, group.",
)
def failed_cmd(
    db: Database, consumer: str | None, type_: str | None, group: str | None, listing: Listing
) -> None:
    """List dead inbox rows (failed, and halted: dead and holding their group), oldest
    first, or show one row with --show ID.

    \b
    Exit codes: 0 printed (even an empty list), 1 the database could not be read or the
    --show row does not exist, 2 bad option.
    """
    since_at = since_option(listing.since)
    engine, config = db.open_config()
    echo_dead(
        engine, _DEAD, listing,
        lambda row_id: admin.show(engine, row_id, config=config),
        lambda: admin.list_failed(
            engine, config=config, consumer=consumer, type_=type_, group=group,
            error_like=listing.error_like, since=since_at, limit=listing.limit,
        ),
    )  # fmt: skip


def _dead_cells(r: dict[str, Any]) -> list[str]:
    return [
        str(r["id"]), r["consumer"], r["serial_group"] or "-", r["type"], r["state"],
        str(r["attempts"]), str(r["finished_at"] or "")[:19], first_line(r["last_error"]),
    ]  # fmt: skip


_DEAD = DeadTable(
    "inbox", "inbox",
    ["ID", "CONSUMER", "GROUP", "TYPE", "STATE", "ATTEMPTS", "DIED", "LAST ERROR"],
    _dead_cells, "dead row(s)",
)  # fmt: skip


@click.command("prune")
@database_options
@env_option(
    "--older-than",
    "OUTBOX_INBOX_PRUNE_OLDER_THAN",
    required=True,
    help="Delete done rows finished longer ago than this (30d, 12h, 2w).",
)
@consumer_option
@env_option(
    "--batch", "OUTBOX_INBOX_PRUNE_BATCH", help="Rows per delete transaction.",
    default=admin.PRUNE_BATCH, show_default=True, type=click.IntRange(1, admin.MAX_PRUNE_BATCH),
)  # fmt: skip
@dry_run_option("Count what would be deleted; delete nothing.")
@json_option
def prune_cmd(
    db: Database,
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
    before = older_than_option(older_than)
    engine, config = db.open_config()
    with database_work(engine, "inbox prune"):
        total = admin.count_prunable(engine, before, consumer=consumer, config=config)
        if not dry_run:
            result = delete_with_bar(
                total, "pruning",
                lambda bar: admin.prune(
                    engine, before, consumer=consumer, batch=batch, config=config, progress=bar
                ),
            )  # fmt: skip
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
            deleted_json(result, before, dry_run=False, groups_forgotten=result.groups_forgotten)
        )
        return
    click.echo(
        deleted_line(f"done row(s){scope}", older_than, result)
        + f"; {result.groups_forgotten} idle group row(s) forgotten"
    )


@click.command("groups")
@database_options
@consumer_option
@limit_option("At most this many groups.")
@json_option
def groups_cmd(db: Database, consumer: str | None, limit: int, as_json: bool) -> None:
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
    engine, config = db.open_config()
    now = utcnow()
    with database_work(engine, "inbox groups"):
        reports = blocked_groups(engine, now=now, consumer=consumer, limit=limit, config=config)
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
    click.echo(counted(len(reports), "group(s)", limit))


commands: list[click.Command] = [failed_cmd, prune_cmd, groups_cmd]
