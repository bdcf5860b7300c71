"""``outbox inbox retry | unblock``: the inbox commands that change rows, each with an audit
record (registered on ``inbox_group``)."""

from __future__ import annotations

import sys
from typing import Any

import click

from inbox.cli.options import consumer_option, group_option, type_option
from inbox.ops import admin
from outbox.clock import utcnow
from outbox.ops.cli_common import (
    Change,
    Database,
    all_option,
    change_options,
    database_options,
    database_work,
    echo_ids,
    echo_json,
    env_option,
    exit_not_matched,
    ids_option,
    requeue_with_bar,
    retry_request,
)
from outbox.ops.core import Progress


@click.command("retry")
@database_options
@ids_option(
    "OUTBOX_INBOX_RETRY_IDS",
    "Retry this dead inbox row (repeat; the env var takes space-separated ids).",
)
@all_option(
    "OUTBOX_INBOX_RETRY_ALL", "Retry every dead row (narrow with --consumer/--type/--group)."
)
@consumer_option
@type_option
@group_option
@change_options("Show what would be retried; change nothing.")
def retry_cmd(
    db: Database,
    ids: tuple[int, ...],
    all_: bool,
    consumer: str | None,
    type_: str | None,
    group: str | None,
    change: Change,
) -> None:
    """Put dead inbox rows (failed or halted) back in line as ready: attempts reset, due now.

    A retried row goes back in its serial group's line by its (priority, seq): it runs
    before the group's later messages (after one already running). Only dead rows are
    touched (conditional UPDATE). Audit: one record per 200 rows in <outbox-table>_audit,
    target "inbox", keeping each row's state, attempts and last_error.

    A halted row (on_dead="halt") is released by its retry: its group goes on with that
    row in its place, first, as if it had not failed. To let the group go on WITHOUT it,
    use `outbox inbox unblock GROUP --consumer NAME --reason R` instead (the row stays failed; retry
    it later). A row whose group is halted by another row waits behind that one: the
    output names it.

    \b
    Exit codes: 0 done (or nothing matched --all), 1 an --id was not a dead row (the
    others were still retried) or the database failed, 2 usage error (neither or both of
    --id and --all, empty --reason).
    """
    who = retry_request(ids, all_, change)
    engine, config = db.open_config()
    args: dict[str, Any] = {
        "reason": change.reason, "actor": who, "config": config, "ids": list(ids) if ids else None,
        "consumer": consumer, "type_": type_, "group": group,
    }  # fmt: skip

    def call(dry: bool, progress: Progress) -> admin.RetryResult:
        return admin.retry(engine, now=utcnow(), dry_run=dry, progress=progress, **args)

    with database_work(engine, "inbox retry"):
        result = requeue_with_bar(call, change.dry_run, "retrying")
    _print_retry(result, change, who)
    exit_not_matched("retried", "failed/halted", result.not_retried)


def _print_retry(result: admin.RetryResult, change: Change, who: str) -> None:
    dry_run = change.dry_run

    def ref(g: admin.GroupRef) -> dict[str, Any]:
        return {"consumer": g.consumer, "group": g.group, "halted_by": g.row_id}

    if change.as_json:
        echo_json(
            {
                "ids": result.ids, "not_retried": result.not_retried, "dry_run": dry_run,
                "by": who, "released": [ref(g) for g in result.released],
                "still_halted": [ref(g) for g in result.still_halted], "notes": result.notes,
            }
        )  # fmt: skip
        return
    echo_ids("would retry" if dry_run else "retried", result.ids)
    for g in result.released:
        verb = "would release" if dry_run else "released"
        click.echo(
            f"{verb} group {g.group!r} of consumer {g.consumer!r}, halted by row {g.row_id}: "
            "that row runs first, in its (priority, seq) place"
        )
    for g in result.still_halted:
        click.echo(
            f"note: group {g.group!r} of consumer {g.consumer!r} stays halted by row "
            f"{g.row_id}: the retried rows wait behind it. Retry {g.row_id} too, or "
            f"`outbox inbox unblock {g.group} --consumer {g.consumer} --reason ...`"
        )
    for note in result.notes:
        click.echo(f"note: {note}")
    if result.ids and not dry_run:
        click.echo(f"audit: retry by {who}: {change.reason}")


@click.command("unblock")
@click.argument("group")
@database_options
@env_option(
    "--consumer", "OUTBOX_CONSUMER", required=True, help="The consumer whose group is halted."
)
@change_options("Show the row that halts the group; change nothing.")
def unblock_cmd(
    group: str,
    db: Database,
    consumer: str,
    change: Change,
) -> None:
    """Let GROUP, halted by a dead message (on_dead="halt"), go on WITHOUT that message.

    The halted row becomes failed (`outbox inbox retry --id N` runs it again later, in its
    place if the group has not moved past it) and the group's next message runs. To run the
    dead message again first instead, retry it: that releases the group too. Audit: one
    record in <outbox-table>_audit, target "inbox", keeping the row's attempts and
    last_error.

    \b
    Exit codes: 0 released (or, with --dry-run, would be), 1 the group is not halted (a
    mistyped group or consumer name?) or the database failed, 2 usage error (empty --reason).
    """
    who = change.who()
    dry_run = change.dry_run
    engine, config = db.open_config()
    with database_work(engine, "inbox unblock"):
        result = admin.unblock(
            engine, now=utcnow(), reason=change.reason, actor=who, consumer=consumer,
            group=group, config=config, dry_run=dry_run,
        )  # fmt: skip
    halted_by = result.halted_by
    if change.as_json:
        echo_json(
            {"consumer": consumer, "group": group, "halted_by": halted_by, "released":
             halted_by is not None and not dry_run, "dry_run": dry_run, "by": who,
             "notes": result.notes}
        )  # fmt: skip
    elif halted_by is not None:
        verb = "would release" if dry_run else "released"
        click.echo(
            f"{verb} group {group!r} of consumer {consumer!r}, halted by row {halted_by}: "
            f"the group goes on without it; row {halted_by} {'would stay' if dry_run else 'stays'}"
            f" failed (`outbox inbox retry --id {halted_by}` to run it again)"
        )
        for note in result.notes:
            click.echo(f"note: {note}")
        if not dry_run:
            click.echo(f"audit: unblock by {who}: {change.reason}")
    if halted_by is None:
        click.echo(
            f"error: group {group!r} of consumer {consumer!r} is not halted "
            "(`outbox inbox groups` lists the blocked groups)",
            err=True,
        )
        sys.exit(1)


commands: list[click.Command] = [retry_cmd, unblock_cmd]
