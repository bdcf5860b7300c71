"""``outbox relay`` (registered on the ``outbox`` group by outbox_cli.main)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import click

from outbox import dsn as dsn_mod
from outbox.backoff import Backoff
from outbox.cli_support import (
    dsn_option,
    env_option,
    metrics_options,
    option_stack,
    outbox_table_option,
    queues_option,
)
from outbox.cli_support import fail as _fail
from outbox.config import OutboxConfig
from outbox.errors import OutboxError
from outbox.logs import configure_logging, log_options
from outbox.stop_signals import install_stop_signals
from relay.publishers.settings import PublisherSettings
from relay.settings import RelaySettings

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from relay.relay import Relay

commands: list[click.Command] = []


_RELAY_OPTIONS = option_stack(
    dsn_option,
    env_option(
        "--broker", "OUTBOX_BROKER", required=True,
        help="amqp://user:pass@host:5672/vhost (RabbitMQ) or kafka://host:9092[,host2] (Kafka).",
    ),
    queues_option(
        "OUTBOX_RELAY_QUEUES",
        "Relay only this queue (repeatable; env: space-separated). Default: all queues.",
    ),
    env_option(
        "--batch-size", "OUTBOX_RELAY_BATCH_SIZE", default=RelaySettings.batch_size,
        show_default=True, type=click.IntRange(1),
        help="Rows fetched, published and marked per transaction.",
    ),
    env_option(
        "--poll-interval", "OUTBOX_RELAY_POLL_INTERVAL", default=RelaySettings.poll_interval,
        show_default=True, type=click.FloatRange(min=0.001),
        help="Seconds between polls when idle (PostgreSQL also wakes up on NOTIFY).",
    ),
    env_option(
        "--max-attempts", "OUTBOX_MAX_ATTEMPTS", default=RelaySettings.max_attempts,
        show_default=True, type=click.IntRange(1),
        help="Broker refusals before a row is 'failed' (dead letter, never deleted).",
    ),
    env_option(
        "--backoff-base", "OUTBOX_BACKOFF_BASE", default=Backoff.base_seconds,
        show_default=True, type=click.FloatRange(min=0.001),
        help="Row retry backoff: uniform(0, min(max, base * 2**(attempt-1))) seconds.",
    ),
    env_option(
        "--backoff-max", "OUTBOX_BACKOFF_MAX", default=Backoff.max_seconds, show_default=True,
        type=float,
    ),
    env_option(
        "--confirm-timeout", "OUTBOX_CONFIRM_TIMEOUT", default=PublisherSettings.confirm_timeout,
        show_default=True, type=click.FloatRange(min=0.001),
        help="Seconds a batch may wait for the broker's confirms; then it is rolled back and "
        "published again later (an outage: no attempt counted).",
    ),
    env_option(
        "--time-limit", "OUTBOX_RELAY_TIME_LIMIT", type=click.FloatRange(min=0.001),
        help="Exit 0 after this many seconds (after the current batch), for periodic restarts.",
    ),
    env_option(
        "--max-messages", "OUTBOX_MAX_MESSAGES", type=click.IntRange(1),
        help="Exit 0 after publishing this many messages.",
    ),
    env_option(
        "--stop-when-idle", "OUTBOX_STOP_WHEN_IDLE", is_flag=True,
        help="Exit 0 as soon as nothing is due (tests, one-off drains).",
    ),
    env_option(
        "--no-notify", "OUTBOX_NO_NOTIFY", is_flag=True,
        help="PostgreSQL: do not LISTEN for store() notifications; poll only.",
    ),
    env_option(
        "--pipeline/--no-pipeline", "OUTBOX_PIPELINE", default=RelaySettings.pipeline,
        show_default=True,
        help="PostgreSQL/MariaDB: fetch and lock the next batch while the broker confirms "
        "a full one (two batches in flight; per-key order kept). On by default: one relay "
        "drains faster with it (docs/relay.md); OUTBOX_PIPELINE=false turns it off.",
    ),
    env_option(
        "--fanout", "OUTBOX_RABBITMQ_FANOUT", is_flag=True,
        help="RabbitMQ: publish to a fan-out exchange per <queue>_<priority> (consumers bind).",
    ),
    env_option(
        "--queue-arguments", "OUTBOX_RABBITMQ_QUEUE_ARGUMENTS", default="",
        help='RabbitMQ: JSON arguments for queue_declare, e.g. \'{"x-queue-type": "quorum"}\'.',
    ),
    env_option(
        "--kafka-partitions", "OUTBOX_KAFKA_PARTITIONS", type=click.IntRange(1),
        default=PublisherSettings.kafka_partitions, show_default=True,
        help="Kafka: partitions of the topics the relay creates.",
    ),
    outbox_table_option("Outbox table."),
    env_option(
        "--notify-channel", "OUTBOX_NOTIFY_CHANNEL", default=OutboxConfig.notify_channel,
        show_default=True, help="PostgreSQL channel store() notifies.",
    ),
    metrics_options(
        "Serve Prometheus metrics (published, publish errors, batch seconds, delivery lag, "
        "and the outbox gauges of the database: pending, oldest pending age, failed) on this "
        "port. Default: no metrics server."
    ),
    log_options,
)  # fmt: skip


@click.command()
@_RELAY_OPTIONS
def relay(
    dsn: str,
    broker: str,
    queues: tuple[str, ...],
    batch_size: int,
    poll_interval: float,
    max_attempts: int,
    backoff_base: float,
    backoff_max: float,
    confirm_timeout: float,
    time_limit: float | None,
    max_messages: int | None,
    stop_when_idle: bool,
    no_notify: bool,
    pipeline: bool,
    fanout: bool,
    queue_arguments: str,
    kafka_partitions: int,
    outbox_table: str,
    notify_channel: str,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str,
    library_log_level: str,
) -> None:
    """Publish committed outbox rows to RabbitMQ or Kafka (<queue>_<priority>).

    Several relays may share one PostgreSQL or MariaDB database (FOR UPDATE SKIP LOCKED);
    SQLite allows one relay per file. SIGTERM/SIGINT finish the current batch and exit 0.
    """
    # Imported here: `outbox --help` must not load pika and SQLAlchemy engines.
    from outbox import metrics as metrics_mod
    from relay.publishers import publisher_from_url
    from relay.relay import Relay

    configure_logging(log_level, library_log_level)
    if not broker.strip():
        _fail("broker: empty; the relay needs --broker (the database source is the worker's)")
    try:
        options = PublisherSettings(
            confirm_timeout=confirm_timeout,
            fanout=fanout,
            queue_arguments=_queue_arguments(queue_arguments),
            kafka_partitions=kafka_partitions,
        ).options_for(broker)
        config = OutboxConfig(outbox_table=outbox_table, notify_channel=notify_channel)
        settings = RelaySettings(
            batch_size=batch_size,
            poll_interval=poll_interval,
            max_attempts=max_attempts,
            backoff=Backoff(backoff_base, backoff_max),
            queues=tuple(q for arg in queues for q in arg.split()),
            time_limit=time_limit,
            max_messages=max_messages,
            stop_when_idle=stop_when_idle,
            use_notify=not no_notify,
            pipeline=pipeline,
            config=config,
        )
        engine = dsn_mod.make_engine(dsn)
        publisher = publisher_from_url(broker, **options)
        metrics = metrics_mod.default()
        if metrics_port is not None:
            metrics_mod.serve_process(
                metrics_port, engine, config, host=metrics_host, queues=settings.queues
            )
        loop = Relay(engine, publisher, settings, metrics=metrics)
    except (OutboxError, ValueError) as exc:
        _fail(str(exc))
    _run(loop, engine, broker)


def _queue_arguments(text: str) -> dict[str, Any] | None:
    """--queue-arguments as a mapping (None when empty); not a JSON object raises."""
    if not text:
        return None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise OutboxError(f"queue-arguments: not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise OutboxError("queue-arguments: expected a JSON object")
    return parsed


def _run(loop: Relay, engine: Engine, broker: str) -> None:
    """Run the relay loop until it stops (signals finish the current batch), then log why."""
    log = logging.getLogger("relay")

    def _stop(reason: str) -> None:
        log.info("%s: finishing the current batch", reason)
        loop.stop()

    install_stop_signals(_stop)
    log.info(
        "relay started: database %s, broker %s, queues %s",
        engine.url.render_as_string(hide_password=True),
        dsn_mod.mask(broker),
        ", ".join(loop.settings.queues) or "all",
    )
    try:
        stats = loop.run()
    except OutboxError as exc:
        _fail(str(exc))
    finally:
        engine.dispose()
    log.info(
        "relay exiting (%s): %d published, %d refused, %d failed, %d broker errors, "
        "%d database errors",
        stats.exit_reason,
        stats.sent,
        stats.refused,
        stats.failed,
        stats.broker_errors,
        stats.database_errors,
    )


commands.append(relay)
