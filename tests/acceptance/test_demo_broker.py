"""``outbox demo --broker URL``: the S1 jobs through a relay process and a real broker.

Runs the installed ``outbox`` command as a user would, then checks what it printed (the S1
order, every step, passwords masked) against what the database recorded (7 rows sent, 7
inbox rows done, 7 effects, never two at once) and that the run's queues are gone from the
broker afterwards. An unreachable broker fails the demo before anything is stored."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pika
import pika.exceptions
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from outbox import inbox_table, outbox_table, states
from outbox.dsn import make_engine
from outbox_cli import demo_consumer
from tests.support import services
from tests.support.kafka import KafkaBroker, free_port

OUTBOX = str(Path(sys.executable).with_name("outbox"))
ORDER = re.compile(r"^\d+\. processing order: (?P<order>(?:[a-z]\d ?)+)", re.MULTILINE)
QUEUE = re.compile(r"group (?P<queue>transcribe-[0-9a-f]{8})/rec-1")


def _rabbitmq() -> str:
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")
    return services.RABBITMQ_URL


def _demo(dsn: str, broker: str) -> str:
    done = subprocess.run(
        [OUTBOX, "demo", "--dsn", dsn, "--broker", broker],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def _check_run(dsn: str, output: str, secrets: list[str]) -> str:
    """What the demo printed agrees with what the database recorded; returns the queue."""
    match = ORDER.search(output)
    assert match, output
    assert match["order"].split() == ["a1", "b1", "d1", "e1", "g1", "c2", "f2"]
    assert "two of the group at once: never" in output
    assert "the relay published the 7 rows and exited 0" in output
    assert "exit codes 0 0" in output
    for secret in secrets:
        assert secret not in output
    if secrets:
        assert ":***@" in output  # the URLs were shown, masked
    found = QUEUE.search(output)
    assert found, output
    queue = found["queue"]

    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            statuses = conn.execute(
                select(outbox_table.c.status, func.count())
                .where(outbox_table.c.queue == queue)
                .group_by(outbox_table.c.status)
            ).all()
            done = conn.execute(
                select(func.count()).where(
                    inbox_table.c.queue == queue, inbox_table.c.state == states.DONE
                )
            ).scalar_one()
        runs = demo_consumer.read_runs(engine)[-7:]
    finally:
        engine.dispose()
    assert dict(statuses) == {states.SENT: 7}
    assert done == 7
    assert [r.mark for r in runs] == ["a", "b", "d", "e", "g", "c", "f"]
    assert all(b.started >= a.finished for a, b in itertools.pairwise(runs))
    return queue


def _rabbitmq_queue_exists(url: str, name: str) -> bool:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if connection.is_open:
            connection.close()


def test_demo_through_rabbitmq_on_sqlite(tmp_path: Path) -> None:
    broker = _rabbitmq()
    dsn = f"sqlite:///{tmp_path / 'demo.db'}"
    output = _demo(dsn, broker)
    password = urlsplit(broker).password
    assert password
    queue = _check_run(dsn, output, [f":{password}@"])
    assert f"{queue}_1" in output  # the relay's destinations were named
    for priority in (1, 2):
        assert not _rabbitmq_queue_exists(broker, f"{queue}_{priority}")


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_demo_through_rabbitmq_on_postgresql_masks_the_dsn(dsn: str) -> None:
    """--dsn: the processes share a PostgreSQL database; its password is never printed
    (trust authentication ignores the one we add). A second run on the same database runs
    on a queue of its own and reports only its own jobs."""
    broker = _rabbitmq()
    with_password = make_url(dsn).set(password="dsn-s3cret").render_as_string(hide_password=False)
    secrets = ["dsn-s3cret", f":{urlsplit(broker).password}@"]
    first = _check_run(with_password, _demo(with_password, broker), secrets)
    second = _check_run(with_password, _demo(with_password, broker), secrets)
    assert first != second


def test_demo_through_kafka_on_sqlite(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    from confluent_kafka.admin import AdminClient

    dsn = f"sqlite:///{tmp_path / 'demo.db'}"
    output = _demo(dsn, kafka_broker.url)
    queue = _check_run(dsn, output, secrets=[])  # kafka:// URLs carry no password
    topics = AdminClient({"bootstrap.servers": kafka_broker.bootstrap}).list_topics(timeout=10)
    assert not {f"{queue}_1", f"{queue}_2"} & set(topics.topics)


def test_demo_with_an_unreachable_broker_fails_before_storing(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    dsn = f"sqlite:///{tmp_path / 'demo.db'}"
    done = subprocess.run(
        [OUTBOX, "demo", "--dsn", dsn, "--broker", f"amqp://guest:s3cret@127.0.0.1:{port}/"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"error: broker: amqp://guest:***@127.0.0.1:{port}/ unreachable" in done.stderr
    assert "s3cret" not in output
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(outbox_table)).scalar_one() == 0
    finally:
        engine.dispose()
