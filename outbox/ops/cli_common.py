"""Options and output helpers shared by the operator commands."""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click
from sqlalchemy import Engine

# Re-exported: the operator commands import their shared options from here.
from outbox.cli_support import db_options as db_options
from outbox.cli_support import fail as fail
from outbox.clock import utcnow
from outbox.config import OutboxConfig
from outbox.dsn import make_engine
from outbox.errors import OutboxError
from outbox.ops.parse import parse_since
from outbox.schema import Schema, schema_for

F = TypeVar("F", bound=Callable[..., Any])


def json_option(func: F) -> F:
    return click.option(
        "--json",
        "as_json",
        envvar="OUTBOX_JSON",
        show_envvar=True,
        is_flag=True,
        help="Print JSON instead of a table.",
    )(func)


def audit_options(func: F) -> F:
    """``--reason`` (required) and ``--by``: what an audited command records besides the ids."""
    func = click.option(
        "--by", "actor", envvar="OUTBOX_ACTOR", show_envvar=True, default=None,
        help="Who, for the audit record. Default: the OS user.",
    )(func)  # fmt: skip
    return click.option(
        "--reason", envvar="OUTBOX_REASON", show_envvar=True, required=True,
        help="Why (kept in the audit table with who and when).",
    )(func)  # fmt: skip


def queue_type_options(func: F) -> F:
    func = click.option(
        "--type", "type_", envvar="OUTBOX_TYPE", show_envvar=True, help="Only this type."
    )(func)
    return click.option(
        "--queue", envvar="OUTBOX_QUEUE", show_envvar=True, help="Only this queue."
    )(func)


def retry_request(ids: tuple[int, ...], all_: bool, reason: str, actor: str | None) -> str:
    """Check a retry's selection and reason (usage errors, exit 2); return who retries."""
    if bool(ids) == all_:
        raise click.UsageError("give either --id ID... or --all")
    return audit_actor(reason, actor)


def audit_actor(reason: str, actor: str | None) -> str:
    """Check an audited command's ``--reason`` (usage error, exit 2); return who acts."""
    if not reason.strip():
        raise click.BadParameter("must not be empty", param_hint="--reason")
    return actor or getpass.getuser()


def open_config(dsn: str, outbox_table: str, inbox_table: str) -> tuple[Engine, OutboxConfig]:
    try:
        config = OutboxConfig(outbox_table=outbox_table, inbox_table=inbox_table)
        return make_engine(dsn), config
    except OutboxError as exc:
        fail(str(exc))


def open_db(dsn: str, outbox_table: str, inbox_table: str) -> tuple[Engine, Schema]:
    engine, config = open_config(dsn, outbox_table, inbox_table)
    return engine, schema_for(config)


def since_option(since: str | None, option: str = "--since") -> datetime | None:
    """``--since`` (``2h``, ``2026-11-30T03:00``...) as a time, or a usage error naming it."""
    try:
        return parse_since(since, utcnow()) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    for line in [headers, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
