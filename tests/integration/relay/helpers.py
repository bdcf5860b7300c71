"""Helpers of the relay tests: unique names, storing rows, reading RabbitMQ back, cleanup."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
from sqlalchemy import Engine, func, select

from outbox import states
from outbox.schema import outbox_table
from outbox.store import Message, store_many
from outbox.wire import Envelope, from_wire
from tests.support import services

RABBIT = services.RABBITMQ_URL
KIB_PAYLOAD = "x" * 1000


def unique_queue(prefix: str = "rl") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def require_rabbitmq() -> None:
    try:
        pika.BlockingConnection(pika.URLParameters(RABBIT)).close()
    except Exception as exc:
        services.missing("rabbitmq", str(exc).splitlines()[0] if str(exc) else repr(exc))


@contextlib.contextmanager
def rabbit_channel() -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(RABBIT))
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.fixture
def rabbit_names() -> Iterator[list[str]]:
    """Queue/exchange names a test creates; deleted afterwards."""
    require_rabbitmq()
    names: list[str] = []
    yield names
    with rabbit_channel() as ch:
        for name in names:
            ch.queue_delete(name)
            ch.exchange_delete(name)


@dataclass(frozen=True)
class Delivered:
    envelope: Envelope
    properties: Any


def read_queue(name: str, expected: int, timeout: float = 60.0) -> list[Delivered]:
    """Read (and ack) messages from ``name`` until ``expected`` distinct event ids arrived
    (duplicates are returned too) or ``timeout``."""
    out: list[Delivered] = []
    seen: set[Any] = set()
    deadline = time.monotonic() + timeout
    with rabbit_channel() as ch:
        ch.queue_declare(name, durable=True)
        ch.basic_qos(prefetch_count=1000)
        for method, props, body in ch.consume(name, inactivity_timeout=0.2):
            if method is not None:
                out.append(Delivered(from_wire(props.headers, body), props))
                seen.add(out[-1].envelope.event_id)
                ch.basic_ack(method.delivery_tag)
            if len(seen) >= expected or time.monotonic() > deadline:
                break
        ch.cancel()
    return out


def store_rows(engine: Engine, messages: Iterable[Message], chunk: int = 1000) -> None:
    batch: list[Message] = []
    for message in messages:
        batch.append(message)
        if len(batch) >= chunk:
            with engine.begin() as conn:
                store_many(conn, batch)
            batch = []
    if batch:
        with engine.begin() as conn:
            store_many(conn, batch)


def status_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(outbox_table.c.status, func.count()).group_by(outbox_table.c.status)
        ).all()
    return {str(status): int(n) for status, n in rows}


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def all_sent(engine: Engine, total: int) -> bool:
    return status_counts(engine).get(states.SENT, 0) == total


class RelayProcess:
    """``outbox relay`` in a process of its own, logging to a file."""

    def __init__(self, dsn: str, log: Path, *extra: str, broker: str = RABBIT) -> None:
        self.cmd = [
            str(Path(sys.executable).with_name("outbox")),
            "relay",
            "--dsn",
            dsn,
            "--broker",
            broker,
            *extra,
        ]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> RelayProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=out)
        self.starts += 1
        return self

    def started(self) -> bool:
        return self.log.read_text().count("relay started") >= self.starts

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def batches(self) -> int:
        return self.log.read_text().count("batch: ")
