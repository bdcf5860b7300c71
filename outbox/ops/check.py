"""``outbox check``: is this deployment able to work? Each check says what it found.

The database is reached, the schema is at the latest migration, the indexes the relay, the
worker and the gauges rely on exist, and (when given) the broker accepts a connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from sqlalchemy import Engine, Table, UniqueConstraint, inspect

from outbox.dsn import mask
from outbox.ops import queries as q
from outbox.schema import Schema


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return mask(lines[0] if lines else type(exc).__name__)


def required_indexes(table: Table) -> set[str]:
    """Named indexes and unique constraints the code declares for ``table``."""
    names = {str(i.name) for i in table.indexes if i.name}
    names |= {str(c.name) for c in table.constraints if c.name and isinstance(c, UniqueConstraint)}
    return names


def _present_indexes(engine: Engine, table: str) -> set[str]:
    inspector = inspect(engine)
    names = {str(i["name"]) for i in inspector.get_indexes(table) if i.get("name")}
    names |= {str(u["name"]) for u in inspector.get_unique_constraints(table) if u.get("name")}
    return names


def check_database(engine: Engine, schema: Schema) -> list[CheckResult]:
    results: list[CheckResult] = []
    try:
        with engine.connect() as conn:
            conn.execute(q.ping())
    except Exception as exc:
        return [CheckResult("database", False, f"unreachable: {_first_line(exc)}")]
    results.append(CheckResult("database", True, f"reachable ({engine.dialect.name})"))

    from outbox import migrate  # Alembic: loaded by this check, not by every operator command

    head = migrate.head_revision()
    try:
        current = migrate.current_revision(engine)
    except Exception as exc:
        current = None
        results.append(CheckResult("schema", False, f"cannot read: {_first_line(exc)}"))
    else:
        if current == head:
            results.append(CheckResult("schema", True, f"at revision {head} (latest)"))
        else:
            results.append(
                CheckResult(
                    "schema",
                    False,
                    f"at revision {current or 'none'}, latest is {head}: run `outbox migrate`",
                )
            )

    for table in (schema.outbox, schema.inbox, schema.audit):
        wanted = required_indexes(table)
        try:
            present = _present_indexes(engine, table.name)
        except Exception as exc:
            results.append(
                CheckResult(f"indexes:{table.name}", False, f"cannot read: {_first_line(exc)}")
            )
            continue
        missing = sorted(wanted - present)
        if missing:
            results.append(
                CheckResult(f"indexes:{table.name}", False, "missing: " + ", ".join(missing))
            )
        else:
            results.append(CheckResult(f"indexes:{table.name}", True, f"{len(wanted)} present"))
    return results


def _check_amqp(url: str, timeout: float) -> str:
    import pika

    params = pika.URLParameters(url)
    params.socket_timeout = timeout
    params.blocked_connection_timeout = timeout
    params.connection_attempts = 1
    connection = pika.BlockingConnection(params)
    try:
        return f"RabbitMQ {params.host}:{params.port} accepted a connection"
    finally:
        connection.close()


def _check_kafka(url: str, timeout: float) -> str:
    from confluent_kafka.admin import AdminClient

    servers = unquote(urlsplit(url).netloc)
    # log_level 0: librdkafka would print every refused connection to stderr itself; the
    # check reports the outcome once.
    client = AdminClient(
        {"bootstrap.servers": servers, "socket.timeout.ms": int(timeout * 1000), "log_level": 0}
    )
    metadata = client.list_topics(timeout=timeout)
    return f"Kafka {servers}: {len(metadata.brokers)} broker(s) answered"


BROKER_CHECKS: dict[str, Callable[[str, float], str]] = {
    "amqp": _check_amqp,
    "amqps": _check_amqp,
    "kafka": _check_kafka,
}


# Seconds the broker check waits for a connection, unless told otherwise.
BROKER_TIMEOUT = 5.0


def check_broker(url: str, timeout: float = BROKER_TIMEOUT) -> CheckResult:
    scheme = urlsplit(url).scheme
    probe = BROKER_CHECKS.get(scheme)
    if probe is None:
        return CheckResult(
            "broker", False, f"{mask(url)}: unknown scheme {scheme!r} (amqp:// or kafka://)"
        )
    try:
        return CheckResult("broker", True, probe(url, timeout))
    except Exception as exc:
        return CheckResult("broker", False, f"{mask(url)} unreachable: {_first_line(exc)}")
