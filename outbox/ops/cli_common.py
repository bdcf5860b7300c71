"""Options and output helpers shared by the operator commands."""

from __future__ import annotations

import getpass
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

import click
from sqlalchemy import Engine

from outbox.cli_support import F, gathered, option_stack

# Re-exported: the operator commands import their shared options from here.
from outbox.cli_support import db_options as db_options
from outbox.cli_support import env_option as env_option
from outbox.cli_support import fail as fail
from outbox.clock import utcnow
from outbox.config import OutboxConfig
from outbox.dsn import make_engine
from outbox.errors import OutboxError
from outbox.ops.core import DeleteResult, Progress, no_progress
from outbox.ops.parse import parse_duration, parse_since
from outbox.schema import Schema, schema_for

json_option = env_option(
    "--json", "OUTBOX_JSON", "as_json", is_flag=True, help="Print JSON instead of a table."
)
# ``--reason`` (required) and ``--by``: what an audited command records besides the ids.
audit_options = option_stack(
    env_option(
        "--reason", "OUTBOX_REASON", required=True,
        help="Why (kept in the audit table with who and when).",
    ),
    env_option(
        "--by", "OUTBOX_ACTOR", "actor", default=None,
        help="Who, for the audit record. Default: the OS user.",
    ),
)  # fmt: skip
queue_type_options = option_stack(
    env_option("--queue", "OUTBOX_FILTER_QUEUE", help="Only this queue."),
    env_option("--type", "OUTBOX_TYPE", "type_", help="Only this type."),
)
error_like_option = env_option(
    "--error-like", "OUTBOX_ERROR_LIKE", help="Only rows whose last_error contains this text."
)


def limit_option(help_: str) -> Callable[[F], F]:
    """``--limit`` of the listing commands."""
    return env_option(
        "--limit", "OUTBOX_LIST_LIMIT", default=100, show_default=True,
        type=click.IntRange(1, 100000), help=help_,
    )  # fmt: skip


def dry_run_option(help_: str) -> Callable[[F], F]:
    return env_option("--dry-run", "OUTBOX_DRY_RUN", is_flag=True, help=help_)


@dataclass(frozen=True)
class Database:
    """``--dsn``, ``--outbox-table`` and ``--inbox-table`` of an operator command."""

    dsn: str
    outbox_table: str
    inbox_table: str

    def open_config(self) -> tuple[Engine, OutboxConfig]:
        """The engine and the config naming the tables; a bad DSN or name exits 1."""
        try:
            config = OutboxConfig(outbox_table=self.outbox_table, inbox_table=self.inbox_table)
            return make_engine(self.dsn), config
        except OutboxError as exc:
            fail(str(exc))

    def open(self) -> tuple[Engine, Schema]:
        engine, config = self.open_config()
        return engine, schema_for(config)


# db_options, handed to the command as one ``db``.
database_options = option_stack(db_options, gathered("db", Database))


@dataclass(frozen=True)
class Change:
    """``--dry-run``, ``--reason``, ``--by`` and ``--json`` of a command that changes rows."""

    dry_run: bool
    reason: str
    actor: str | None
    as_json: bool

    def who(self) -> str:
        return audit_actor(self.reason, self.actor)


def change_options(dry_run_help: str) -> Callable[[F], F]:
    """--dry-run (``dry_run_help`` says what it shows), the audit options and --json, handed
    to the command as one ``change``."""
    return option_stack(
        dry_run_option(dry_run_help), audit_options, json_option, gathered("change", Change)
    )


def ids_option(env: str, help_: str) -> Callable[[F], F]:
    """``--id`` (repeatable) of the commands that change rows chosen by id."""
    return env_option("--id", env, "ids", multiple=True, type=int, help=help_)


def all_option(env: str, help_: str) -> Callable[[F], F]:
    return env_option("--all", env, "all_", is_flag=True, help=help_)


@contextmanager
def database_work(engine: Engine, what: str) -> Iterator[None]:
    """Exit 1 with ``<what> failed: <error>`` if the block fails; dispose of the engine."""
    try:
        yield
    except Exception as exc:
        fail(f"{what} failed: {exc}")
    finally:
        engine.dispose()


class Requeued(Protocol):
    @property
    def ids(self) -> list[int]: ...


R = TypeVar("R", bound=Requeued)
D = TypeVar("D", bound=DeleteResult)


def requeue_with_bar(call: Callable[[bool, Progress], R], dry_run: bool, label: str) -> R:
    """A dry run first (it is --dry-run's answer and gives the progress bar its length),
    then, unless ``dry_run``, the change, with a bar on stderr."""
    result = call(True, no_progress)
    if not dry_run and result.ids:
        with click.progressbar(length=len(result.ids), label=label, file=sys.stderr) as bar:
            result = call(False, bar.update)
    return result


def echo_ids(done: str, ids: Sequence[int]) -> None:
    """``retried 3 row(s): 1 2 3`` (the first 50 ids)."""
    shown = " ".join(str(i) for i in ids[:50]) + (" ..." if len(ids) > 50 else "")
    click.echo(f"{done} {len(ids)} row(s)" + (f": {shown}" if shown else ""))


def exit_not_matched(past: str, status: str, ids: Sequence[int]) -> None:
    """Exit 1 naming the asked-for ids the command did not take (none: return)."""
    if ids:
        click.echo(
            f"error: not {past} (no such row, not {status}, or outside the filters): "
            + " ".join(str(i) for i in ids),
            err=True,
        )
        sys.exit(1)


def older_than_option(value: str) -> datetime:
    """``--older-than`` (``30d``, ``12h``) as the time before which rows go."""
    try:
        return utcnow() - parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None


def delete_with_bar(total: int, label: str, run: Callable[[Progress], D]) -> D:
    with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
        return run(bar.update)


def deleted_json(result: DeleteResult, before: datetime, **extra: Any) -> dict[str, Any]:
    return {
        **extra, "deleted": result.deleted, "batches": result.batches,
        "seconds": round(result.seconds, 3), "rows_per_second": round(result.rows_per_second, 1),
        "before": before.isoformat(),
    }  # fmt: skip


def deleted_line(what: str, older_than: str, result: DeleteResult) -> str:
    """``deleted N <what> older than X in B batch(es), S, R rows/s`` (the caller may add)."""
    return (
        f"deleted {result.deleted} {what} older than {older_than} in "
        f"{result.batches} batch(es), {result.seconds:.2f}s, {result.rows_per_second:.0f} rows/s"
    )


def retry_request(ids: tuple[int, ...], all_: bool, change: Change) -> str:
    """Check a retry's selection and reason (usage errors, exit 2); return who retries."""
    if bool(ids) == all_:
        raise click.UsageError("give either --id ID... or --all")
    return change.who()


def audit_actor(reason: str, actor: str | None) -> str:
    """Check an audited command's ``--reason`` (usage error, exit 2); return who acts."""
    if not reason.strip():
        raise click.BadParameter("must not be empty", param_hint="--reason")
    return actor or getpass.getuser()


def since_option(since: str | None, option: str = "--since") -> datetime | None:
    """``--since`` (``2h``, ``2026-11-30T03:00``...) as a time, or a usage error naming it."""
    try:
        return parse_since(since, utcnow()) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def echo_row(row: dict[str, Any], as_json: bool) -> None:
    """One row whole (``--show``): JSON, or ``key: value`` lines with JSON values indented."""
    if as_json:
        echo_json(row)
        return
    for key, value in row.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value, indent=2, sort_keys=True)
        click.echo(f"{key}: {value}")


def echo_shown(
    show_id: int | None,
    row: dict[str, Any] | None,
    rows: list[dict[str, Any]],
    as_json: bool,
    kind: str,
) -> bool:
    """The ``--show ID`` row (exit 1 when there is none) or, with ``--json``, the rows of a
    failed-rows listing; False: nothing printed, the caller prints its table."""
    if show_id is not None:
        if row is None:
            fail(f"no {kind} row with id {show_id}")
        echo_row(row, as_json)
        return True
    if as_json:
        echo_json(rows)
        return True
    return False


@dataclass(frozen=True)
class Listing:
    """``--error-like``, ``--since``, ``--limit``, ``--show`` and ``--json`` of a
    failed-rows command."""

    error_like: str | None
    since: str | None
    limit: int
    show_id: int | None
    as_json: bool


def listing_options(since_help: str, show_env: str, show_help: str) -> Callable[[F], F]:
    """The options of a failed-rows command after its own filters, handed to the command
    as one ``listing``."""
    return option_stack(
        error_like_option,
        env_option("--since", "OUTBOX_SINCE", help=since_help),
        limit_option("At most this many rows."),
        env_option("--show", show_env, "show_id", type=int, help=show_help),
        json_option,
        gathered("listing", Listing),
    )


@dataclass(frozen=True)
class DeadTable:
    """How a failed-rows command prints: ``work`` names it when the database fails,
    ``kind`` the table when the --show row is missing; the listing is a table of
    ``headers``, a row's ``cells`` each, counted as ``what``."""

    work: str
    kind: str
    headers: list[str]
    cells: Callable[[dict[str, Any]], list[str]]
    what: str


def echo_dead(
    engine: Engine,
    dead: DeadTable,
    listing: Listing,
    show: Callable[[int], dict[str, Any] | None],
    rows: Callable[[], list[dict[str, Any]]],
) -> None:
    """What a failed-rows command does once its options are read: the ``--show`` row
    whole, or else the ``rows`` as JSON or as a table and their count."""
    show_id = listing.show_id
    with database_work(engine, dead.work):
        row = show(show_id) if show_id is not None else None
        found = [] if show_id is not None else rows()
    if echo_shown(show_id, row, found, listing.as_json, dead.kind):
        return
    table(dead.headers, [dead.cells(r) for r in found])
    click.echo(counted(len(found), dead.what, listing.limit))


def first_line(text: str | None, width: int = 80) -> str:
    return text.splitlines()[0][:width] if text else ""


def counted(n: int, what: str, limit: int) -> str:
    """``3 failed row(s)``, and `` (limit reached)`` when the listing stopped at ``limit``."""
    return f"{n} {what}" + (" (limit reached)" if n == limit else "")


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    for line in [headers, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
