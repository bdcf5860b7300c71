"""The ``outbox`` command. Each subcommand lives with the package it drives: this module
only gathers them (it sits above outbox/, relay/ and inbox/, which never import it).

Every option also reads an environment variable (shown in ``--help``). Exit codes: 0 success,
1 operation failed (message on stderr), 2 usage error (click's).
"""

from __future__ import annotations

import click

from outbox.cli_groups import LazyGroup
from outbox.cli_support import DSN_HELP, db_options, fail
from outbox.errors import OutboxError

# Each subcommand's module is imported when that subcommand is used (outbox/cli_groups.py):
# `outbox worker` loads neither the operator commands nor the operator page nor Alembic.
SUBCOMMANDS = {
    "relay": "relay.cli:relay",
    "worker": "inbox.cli:worker",
    "inbox": "inbox.cli:inbox_group",
    "metrics": "outbox.ops.cli:metrics_cmd",
    "stats": "outbox.ops.cli:stats_cmd",
    "failed": "outbox.ops.cli:failed_cmd",
    "retry": "outbox.ops.cli_repair:retry_cmd",
    "republish": "outbox.ops.cli_repair:republish_cmd",
    "compact": "outbox.ops.cli_repair:compact_cmd",
    "check": "outbox.ops.cli:check_cmd",
    "ui": "outbox_ui.command:ui_cmd",
}


@click.group(
    cls=LazyGroup, lazy=SUBCOMMANDS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="outbox-relay")
def main() -> None:
    """outbox-relay: transactional outbox, relay to RabbitMQ/Kafka, inbox with exactly-once effect.

    Producers call outbox.store() inside their own transaction; `outbox relay` publishes
    committed rows; `outbox worker` runs handlers exactly once per (event_id, consumer).
    """


@main.command()
@db_options
@click.option(
    "--sql", "print_sql", is_flag=True, help="Print the SQL for this dialect; run nothing."
)
def migrate(dsn: str, print_sql: bool, outbox_table: str, inbox_table: str) -> None:
    """Create or upgrade the outbox and inbox tables (idempotent).

    With --sql, print the DDL for the DSN's dialect instead, for teams that apply migrations
    themselves. The version is kept in the table outbox_alembic_version.
    """
    from outbox import dsn as dsn_mod
    from outbox import migrate as migrate_mod
    from outbox.config import OutboxConfig

    try:
        config = OutboxConfig(outbox_table=outbox_table, inbox_table=inbox_table)
        url = dsn_mod.normalize(dsn)
        if print_sql:
            click.echo(migrate_mod.upgrade_sql(url, config), nl=False)
            return
        engine = dsn_mod.make_engine(url)
        before = migrate_mod.current_revision(engine)
        head = migrate_mod.upgrade(engine, config)
        engine.dispose()
    except OutboxError as exc:
        fail(str(exc))
    except Exception as exc:  # a database error: say which database, masked
        fail(f"migrate on {url.render_as_string(hide_password=True)} failed: {exc}")
    if before == head:
        click.echo(f"schema already at revision {head}")
    else:
        click.echo(f"schema migrated from {before or 'nothing'} to revision {head}")


@main.command()
@click.option(
    "--dsn",
    envvar="OUTBOX_DSN",
    show_envvar=True,
    default="sqlite:///outbox-demo.db",
    show_default=True,
    help=DSN_HELP,
)
@click.option(
    "--keep", is_flag=True, help="Keep an existing SQLite demo file instead of starting fresh."
)
@click.option(
    "--broker",
    envvar="OUTBOX_DEMO_BROKER",
    show_envvar=True,
    default="",
    help="amqp://... or kafka://...: run the jobs through `outbox relay` and this broker "
    "(on a queue of the run's own, deleted at the end). Default: no broker.",
)
def demo(dsn: str, keep: bool, broker: str) -> None:
    """Run the pipeline once, explaining each step: store scenario S1's jobs next to an order
    row in one transaction, run two worker processes on them, print the order and the stats.

    The default is the embedded setup: a SQLite file, the database as the source, no services.
    With --broker a relay process publishes the jobs and the workers receive them from it.
    """
    from outbox_cli.demo import run_demo

    try:
        run_demo(dsn, echo=click.echo, fresh=not keep, broker=broker or None)
    except OutboxError as exc:
        fail(str(exc))
