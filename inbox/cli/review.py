"""``outbox inbox review | resolve``: the messages the automatic path left to an operator, and
the operator's decision on one of them (registered on ``inbox_group``; the work is in
``inbox.ops.review``)."""

from __future__ import annotations

from typing import Any

import click

from inbox.cli.options import consumer_option
from inbox.ops import review
from outbox.clock import utcnow
from outbox.ops.cli_common import (
    Change,
    Database,
    change_options,
    database_options,
    database_work,
    echo_json,
    echo_row,
    env_option,
    fail,
    first_line,
    json_option,
    table,
)


@click.command("review")
@database_options
@consumer_option
@env_option(
    "--state", "OUTBOX_INBOX_REVIEW_STATE", "wanted", multiple=True,
    type=click.Choice(review.LISTABLE_STATES),
    help="List rows in this state (repeat). Default: review and unknown.",
)  # fmt: skip
@env_option(
    "--limit", "OUTBOX_INBOX_REVIEW_LIMIT", default=50, show_default=True,
    type=click.IntRange(1, 100000),
    help="At most this many rows (the output says how many more there are).",
)  # fmt: skip
@env_option(
    "--show", "OUTBOX_INBOX_SHOW", "show_id", type=int,
    help="Show one row whole: state, reason, attempts, last_error, next_check, its effect "
    "key and who holds it, its sequence key and number, the key's last applied number and "
    "other unfinished rows, its serial group.",
)  # fmt: skip
@json_option
def review_cmd(
    db: Database,
    consumer: str | None,
    wanted: tuple[str, ...],
    limit: int,
    show_id: int | None,
    as_json: bool,
) -> None:
    """List the inbox rows held for an operator (review and unknown), oldest first, or show
    one with --show ID. Read-only.

    \b
    States:
      review    off the automatic path (reason: sequence-gap, unsupported-schema,
                not-transient, ...); holds its serial group and its sequence key.
                Fix the cause, then `outbox inbox resolve ID --not-applied` to run it
                again, or --skip to finish it without its effect.
      unknown   the handler raised EffectUnknown: its effect may or may not have
                happened; never retried by itself. Make the check in NEXT CHECK, then
                `outbox inbox resolve ID --applied` (it happened) or --not-applied
                (it did not: run it again).
      stale     a number of its sequence key already applied: finished, never applied.
                Nothing to do (listed with --state stale).
      deferred  waits for its key's previous number; runs as soon as that one is
                applied (or resolved --applied / --skip); goes to review after the
                consumer's sequence_gap_timeout.

    \b
    Exit codes: 0 printed (even an empty list), 1 the database could not be read or the
    --show row does not exist, 2 bad option.
    """
    engine, config = db.open_config()
    with database_work(engine, "inbox review"):
        if show_id is not None:
            row = review.show(engine, show_id, config=config)
        else:
            found = review.list_review(
                engine, config=config, wanted=wanted, consumer=consumer, limit=limit
            )
    if show_id is not None:
        if row is None:
            fail(f"no inbox row with id {show_id}")
        echo_row(row, as_json)
        return
    if as_json:
        echo_json({"rows": found.rows, "total": found.total, "more": found.more, "limit": limit})
        return
    table(
        ["ID", "CONSUMER", "GROUP", "TYPE", "STATE", "REASON", "ATTEMPTS", "KEY#", "NEXT CHECK"],
        [_cells(r) for r in found.rows],
    )
    line = f"{len(found.rows)} row(s) in {', '.join(wanted or review.DEFAULT_STATES)}"
    if found.more:
        line += f"; {found.more} more not shown (of {found.total}: raise --limit)"
    click.echo(line)


def _cells(r: dict[str, Any]) -> list[str]:
    key = "-" if r["sequence_key"] is None else f"{r['sequence_key']}#{r['sequence']}"
    return [
        str(r["id"]), r["consumer"], r["serial_group"] or "-", r["type"], r["state"],
        r["reason"] or "-", str(r["attempts"]), key, first_line(r["next_check"], 60) or "-",
    ]  # fmt: skip


@click.command("resolve")
@click.argument("row_id", metavar="ID", type=int)
@database_options
@env_option(
    "--applied", "OUTBOX_RESOLVE_APPLIED", is_flag=True,
    help="Its effect happened: done, effect key recorded, its sequence key and group go on.",
)  # fmt: skip
@env_option(
    "--not-applied", "OUTBOX_RESOLVE_NOT_APPLIED", "not_applied", is_flag=True,
    help="Its effect did not happen: ready again, due now (attempts kept).",
)  # fmt: skip
@env_option(
    "--skip", "OUTBOX_RESOLVE_SKIP", is_flag=True,
    help="Never apply it: done without its effect (reason skipped); its key and group go on.",
)  # fmt: skip
@change_options("Show what the decision would change; change nothing.")
def resolve_cmd(
    row_id: int, db: Database, applied: bool, not_applied: bool, skip: bool, change: Change
) -> None:
    """Decide on inbox row ID, held in review or unknown: exactly one of --applied,
    --not-applied, --skip.

    \b
    --applied      done. Its effect key goes in the effect ledger (the output says if
                   another event holds it already); its sequence key moves to its number
                   and the key's deferred next change becomes ready; its group goes on.
    --not-applied  ready again, due now, reason and next check cleared, attempts kept:
                   a worker runs it once more, in its place in its group.
    --skip         done without its effect (reason "skipped", nothing in the ledger); the
                   key and the group go on as with --applied.

    One transaction locks the row and changes it only if it is still in review or unknown:
    of two operators resolving one row, one does, the other is told its new state. Audit:
    one record in <outbox-table>_audit, target "inbox", action resolve-applied,
    resolve-not-applied or resolve-skip, row_ids [ID].

    \b
    Exit codes: 0 resolved (or, with --dry-run, would be), 1 no such row, the row is not
    in review or unknown, or the database failed, 2 usage error (no mode or more than one,
    no or empty --reason).
    """
    modes = [m for m, on in zip(review.MODES, (applied, not_applied, skip), strict=True) if on]
    if len(modes) != 1:
        raise click.UsageError("give exactly one of --applied, --not-applied, --skip")
    who = change.who()
    engine, config = db.open_config()
    with database_work(engine, "inbox resolve"):
        try:
            result = review.resolve(
                engine, row_id, mode=modes[0], now=utcnow(), reason=change.reason, actor=who,
                config=config, dry_run=change.dry_run,
            )  # fmt: skip
        except review.NotResolvable as exc:
            fail(str(exc))
    if change.as_json:
        echo_json({**result.as_dict(), "by": who})
        return
    _print_resolved(result, who, change.reason)


def _print_resolved(r: review.ResolveResult, who: str, reason: str) -> None:
    would = r.dry_run
    verb = "would resolve" if would else "resolved"
    click.echo(
        f"{verb} row {r.id} of consumer {r.consumer!r} as {r.mode}: {r.old_state} -> {r.new_state}"
    )
    if r.sequence_key is not None:
        click.echo(
            f"sequence key {r.sequence_key!r} (this row: {r.sequence}): last applied "
            f"{_number(r.last_before)} -> {_number(r.last_after)}"
        )
    if r.freed is not None:
        click.echo(f"{'would free' if would else 'freed'} row {r.freed}: deferred -> ready")
    if r.effect_recorded:
        click.echo(
            f"effect key {r.effect_key!r} {'would be ' if would else ''}recorded in the ledger"
        )
    for note in r.notes:
        click.echo(f"note: {note}")
    if r.serial_group is not None:
        mark = "would be marked" if would else "marked"
        click.echo(f"group {r.serial_group!r} {mark} for the head-of-group pass: it goes on")
    if r.audit_id is not None:
        click.echo(f"audit {r.audit_id}: {r.action} by {who}: {reason}")


def _number(n: int | None) -> str:
    return "none" if n is None else str(n)


commands: list[click.Command] = [review_cmd, resolve_cmd]
