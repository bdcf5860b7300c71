"""``outbox inbox failed | retry | prune | groups`` (registered on ``inbox_group``).

Every option reads an environment variable; listing commands have ``--json``; progress bars
go to stderr (a bar on a terminal, the label once otherwise) so ``--json`` stays parseable;
errors are printed with passwords masked. The work is in ``inbox.ops``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from inbox.ops import admin
from inbox.ops.groups import blocked_groups
from outbox.clock import utcnow
from outbox.ops.cli_common import (
    audit_options,
    db_options,
    echo_json,
    fail,
    json_option,
    open_config,
    retry_request,
    since_option,
    table,
)
from outbox.ops.parse import format_age, parse_duration

F = TypeVar("F", bound=Callable[..., Any])


def _opt(name: str, env: str, help_: str, *decls: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that reads ``env`` and shows it in --help."""
    return click.option(name, *decls, envvar=env, show_envvar=True, help=help_, **kwargs)


consumer_option = _opt("--consumer", "OUTBOX_CONSUMER", "Only this consumer.")
type_option = _opt("--type", "OUTBOX_TYPE", "Only this message type.", "type_")
group_option = _opt("--group", "OUTBOX_GROUP", "Only this serial group.")


def _first_line(text: str | None, width: int = 80) -> str:
    return text.splitlines()[0][:width] if text else ""


@click.command("failed")
@db_options
@consumer_option
@type_option
@group_option
@_opt("--error-like", "OUTBOX_ERROR_LIKE", "Only rows whose last_error contains this text.")
@_opt("--since", "OUTBOX_SINCE", "Only rows that died since: a duration back (2h, 7d) or ISO time.")
@_opt(
    "--limit", "OUTBOX_LIMIT", "At most this many rows.", default=100, show_default=True,
    type=click.IntRange(1, 100000),
)  # fmt: skip
@_opt(
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


@click.command("retry")
@db_options
@_opt(
    "--id", "OUTBOX_INBOX_RETRY_IDS",
    "Retry this dead inbox row (repeat; the env var takes space-separated ids).",
    "ids", multiple=True, type=int,
)  # fmt: skip
@_opt(
    "--all", "OUTBOX_INBOX_RETRY_ALL",
    "Retry every dead row (narrow with --consumer/--type/--group).", "all_", is_flag=True,
)  # fmt: skip
@consumer_option
@type_option
@group_option
@_opt("--dry-run", "OUTBOX_DRY_RUN", "Show what would be retried; change nothing.", is_flag=True)
@audit_options
@json_option
def retry_cmd(
    dsn: str,
    outbox_table: str,
    inbox_table: str,
    ids: tuple[int, ...],
    all_: bool,
    consumer: str | None,
    type_: str | None,
    group: str | None,
    dry_run: bool,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Put dead inbox rows (failed or halted) back in line as ready: attempts reset, due now.

    A retried row goes back in its serial group's line by its (priority, seq): it runs
    before the group's later messages (after one already running). Only dead rows are
    touched (conditional UPDATE). Audit: one record per 200 rows in <outbox-table>_audit,
    target "inbox", keeping each row's state, attempts and last_error.

    A halted row (on_dead="halt") is released by its retry: its group goes on with that
    row in its place, first, as if it had not failed. To let the group go on WITHOUT it,
    use `outbox inbox unblock GROUP --consumer NAME` instead (the row stays failed; retry
    it later). A row whose group is halted by another row waits behind that one: the
    output names it.

    \b
    Exit codes: 0 done (or nothing matched --all), 1 an --id was not a dead row (the
    others were still retried) or the database failed, 2 usage error (neither or both of
    --id and --all, empty --reason).
    """
    who = retry_request(ids, all_, reason, actor)
    engine, config = open_config(dsn, outbox_table, inbox_table)
    args: dict[str, Any] = {
        "reason": reason, "actor": who, "config": config, "ids": list(ids) if ids else None,
        "consumer": consumer, "type_": type_, "group": group,
    }  # fmt: skip
    try:
        # The dry run first: it is --dry-run's answer, and gives the bar its length.
        result = admin.retry(engine, now=utcnow(), dry_run=True, **args)
        if not dry_run and result.ids:
            with click.progressbar(length=len(result.ids), label="retrying", file=sys.stderr) as b:
                result = admin.retry(engine, now=utcnow(), progress=b.update, **args)
    except Exception as exc:
        fail(f"inbox retry failed: {exc}")
    finally:
        engine.dispose()
    _print_retry(result, dry_run, who, reason, as_json)
    if result.not_retried:
        click.echo(
            "error: not retried (no such row, not failed/halted, or outside the filters): "
            + " ".join(str(i) for i in result.not_retried),
            err=True,
        )
        sys.exit(1)


def _print_retry(
    result: admin.RetryResult, dry_run: bool, who: str, reason: str, as_json: bool
) -> None:
    def ref(g: admin.GroupRef) -> dict[str, Any]:
        return {"consumer": g.consumer, "group": g.group, "halted_by": g.row_id}

    if as_json:
        echo_json(
            {
                "ids": result.ids, "not_retried": result.not_retried, "dry_run": dry_run,
                "by": who, "released": [ref(g) for g in result.released],
                "still_halted": [ref(g) for g in result.still_halted], "notes": result.notes,
            }
        )  # fmt: skip
        return
    shown = " ".join(str(i) for i in result.ids[:50]) + (" ..." if len(result.ids) > 50 else "")
    click.echo(f"{'would retry' if dry_run else 'retried'} {len(result.ids)} row(s)"
               + (f": {shown}" if shown else ""))  # fmt: skip
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
            f"`outbox inbox unblock {g.group} --consumer {g.consumer}`"
        )
    for note in result.notes:
        click.echo(f"note: {note}")
    if result.ids and not dry_run:
        click.echo(f"audit: retry by {who}: {reason}")


@click.command("prune")
@db_options
@_opt(
    "--older-than", "OUTBOX_INBOX_PRUNE_OLDER_THAN",
    "Delete done rows finished longer ago than this (30d, 12h, 2w).", required=True,
)  # fmt: skip
@consumer_option
@_opt(
    "--batch", "OUTBOX_INBOX_PRUNE_BATCH", "Rows per delete transaction.", default=10000,
    show_default=True, type=click.IntRange(1, admin.MAX_PRUNE_BATCH),
)  # fmt: skip
@_opt("--dry-run", "OUTBOX_DRY_RUN", "Count what would be deleted; delete nothing.", is_flag=True)
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
                "before": before.isoformat(),
            }
        )  # fmt: skip
        return
    click.echo(
        f"deleted {result.deleted} done row(s){scope} older than {older_than} in "
        f"{result.batches} batch(es), {result.seconds:.2f}s, {result.rows_per_second:.0f} rows/s"
    )


@click.command("groups")
@db_options
@consumer_option
@_opt(
    "--limit", "OUTBOX_LIMIT", "At most this many groups.", default=100, show_default=True,
    type=click.IntRange(1, 100000),
)  # fmt: skip
@json_option
def groups_cmd(
    dsn: str, outbox_table: str, inbox_table: str, consumer: str | None, limit: int, as_json: bool
) -> None:
    """Serial groups that are blocked or waiting, longest-held first: the row everyone
    waits for (the head: id, type, priority, state), why, and how many rows wait.

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
            [r.consumer, r.group, str(h.get("id", "-")), str(h.get("state", "-")),
             str(h.get("priority", "-")), str(h.get("type", "-")), str(r.waiting),
             format_age((now - r.since).total_seconds()), r.why]
        )  # fmt: skip
    table(["CONSUMER", "GROUP", "HEAD", "STATE", "PRIO", "TYPE", "WAITING", "HELD", "WHY"], rows)
    click.echo(f"{len(reports)} group(s)" + (" (limit reached)" if len(reports) == limit else ""))


commands: list[click.Command] = [failed_cmd, retry_cmd, prune_cmd, groups_cmd]
