"""Bad input, consumer side, through a real ``outbox worker --source <broker>`` OS process on
PostgreSQL, for RabbitMQ and Kafka.

Malformed broker messages (missing/invalid headers, bad JSON, NaN, non-UTF-8 body, unknown
schema version), unknown types, payloads the handler rejects and handlers that keep raising
are published *ahead of* two serial groups and ungrouped work. Asserted from the database:
each poison message is one ``failed`` inbox row whose reason names what is wrong (acked:
never redelivered, attempts not burnt in a loop), every good message ran exactly once, the
groups kept their order, and the worker went idle and exited 0 (no exception loop).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from outbox import states
from outbox.wire import (
    H_EVENT_ID,
    H_OCCURRED_AT,
    H_OUTBOX_ID,
    H_PRIORITY,
    H_QUEUE,
    H_SCHEMA_VERSION,
    H_SERIAL_GROUP,
    H_TYPE,
)
from tests.integration.bad_input.support import (
    create_effects,
    effect_rows,
    envelope,
    inbox_rows,
    run_worker,
    source_url,
    worker_env,
)
from tests.integration.relay.publishers_fixtures import unique
from tests.integration.sources.sources_fixtures import SourceCase

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)


@dataclass(frozen=True)
class Poison:
    """A raw message and the text its failed inbox row's ``last_error`` must contain."""

    name: str
    headers: dict[str, str] | None
    body: bytes
    reason: str


def _malformed(queue: str, seq: int) -> list[Poison]:
    def headers(**changes: str | None) -> dict[str, str]:
        base = envelope(queue, "x", seq=seq).wire_headers()
        for name, value in changes.items():
            header = name.replace("_", "-")
            if value is None:
                base.pop(header)
            else:
                base[header] = value
        return base

    ok = b'{"mark": "never"}'
    return [
        Poison("no headers", None, ok, "headers: missing"),
        Poison("no type", headers(outbox_type=None), ok, f"{H_TYPE}: header missing"),
        Poison("no event id", headers(outbox_event_id=None), ok, f"{H_EVENT_ID}: header missing"),
        Poison(
            "bad event id", headers(outbox_event_id="order-17"), ok, f"{H_EVENT_ID}: not a UUID"
        ),
        Poison("bad priority", headers(outbox_priority="high"), ok, f"{H_PRIORITY}: 'high' is not"),
        Poison("bad outbox id", headers(outbox_id="7b"), ok, f"{H_OUTBOX_ID}: '7b' is not"),
        Poison(
            "naive time",
            headers(outbox_occurred_at="2026-01-01T00:00:00"),
            ok,
            f"{H_OCCURRED_AT}: has no timezone",
        ),
        Poison(
            "schema v99", headers(outbox_schema_version="99"), ok, f"{H_SCHEMA_VERSION}: version"
        ),
        Poison("not json", headers(), b"{not json", "body: not valid JSON"),
        Poison("nan", headers(), b'{"mark": NaN}', "body: not valid JSON"),
        Poison("not utf-8", headers(), b'{"mark": "\xff\xfe"}', "body: not UTF-8"),
    ]


def test_poison_messages_fail_with_their_reason_and_never_block_other_work(
    engine: Engine, dsn: str, broker: SourceCase, tmp_path: Path
) -> None:
    queue, consumer = unique("bi-"), unique("bi-consumer-")
    create_effects(engine)
    seq = iter(range(1, 1000))
    # Given poison first: malformed on the wire ...
    malformed = _malformed(queue, next(seq))
    for poison in malformed:
        broker.publish_raw(queue, 1, poison.headers, poison.body)
    # ... then well-formed messages no handler can take, or that the handler refuses/fails
    g1, g2 = 'g1/rec\'s "1"', "g2;%"
    rejected = [
        envelope(queue, "unknown", seq=next(seq), type="nobody.handles.this"),
        envelope(queue, "shape", seq=next(seq), body="[1, 2]"),
        envelope(queue, "flaky", seq=next(seq), body='{"mark": "flaky", "fail": 9}'),
        envelope(queue, "g1-head", seq=next(seq), serial_group=g1, body='"just text"'),
    ]
    reasons = {
        "unknown": "unknown message type 'nobody.handles.this'",
        "shape": "BadPayload: expected an object with a string 'mark'",
        "flaky": "RuntimeError: flaky failed on attempt 2",
        "g1-head": "BadPayload",
    }
    # ... and behind them two groups and ungrouped work, interleaved
    good = []
    for i in range(3):
        good.append(envelope(queue, f"g1-{i}", seq=next(seq), serial_group=g1))
        good.append(envelope(queue, f"g2-{i}", seq=next(seq), serial_group=g2))
        good.append(envelope(queue, f"plain-{i}", seq=next(seq)))
    broker.publish(rejected + good)

    # When one worker consumes the broker until idle
    proc = run_worker(dsn, source_url(broker), worker_env(consumer, [queue], ["job"]))

    # Then it exits 0, having gone idle (no exception loop) ...
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = inbox_rows(engine, consumer)
    failed = [r for r in rows if r.state == states.FAILED]
    done = [r for r in rows if r.state == states.DONE]
    # ... every poison message is one failed row naming its problem ...
    for poison in malformed:
        matching = [r for r in failed if poison.reason in (r.last_error or "")]
        assert len(matching) >= 1, f"{poison.name}: no failed row with {poison.reason!r}"
    by_event = {r.event_id: r for r in rows}
    for message in rejected:
        mark = json.loads(message.body)["mark"] if message.body.startswith("{") else None
        row = by_event[message.event_id]
        assert row.state == states.FAILED, message
        assert reasons[mark or ("shape" if message.body == "[1, 2]" else "g1-head")] in (
            row.last_error or ""
        )
    assert len(failed) == len(malformed) + len(rejected)
    # ... acked once, never redelivered in a loop; only the flaky handler used its retries
    assert all(r.duplicates == 0 for r in rows)
    attempts = Counter(r.attempts for r in failed)
    assert attempts[2] == 1  # "flaky": max_attempts=2
    # ... and all good work ran exactly once, the groups in their order
    assert len(done) == len(good)
    marks = [e.mark for e in effect_rows(engine, consumer)]
    assert sorted(marks) == sorted(json.loads(m.body)["mark"] for m in good)
    assert [m for m in marks if m.startswith("g1-")] == ["g1-0", "g1-1", "g1-2"]
    assert [m for m in marks if m.startswith("g2-")] == ["g2-0", "g2-1", "g2-2"]
    groups = {e.mark: e.grp for e in effect_rows(engine, consumer)}
    assert groups["g1-0"] == g1 and groups["g2-0"] == g2 and groups["plain-0"] is None


OVERSIZED = [
    # (case, header changes, field the failed row's reason must name)
    ("type of 300 chars", {H_TYPE: "t" * 300}, "type"),
    ("queue header of 300 chars", {H_QUEUE: "q" * 300}, "outbox-queue"),
    ("serial group of 300 chars", {H_SERIAL_GROUP: "g" * 300}, "outbox-serial-group"),
    ("priority over smallint", {H_PRIORITY: "40000"}, "outbox-priority"),
    ("outbox id over bigint", {H_OUTBOX_ID: str(2**64)}, "outbox-id"),
]


def test_oversized_names_and_out_of_range_numbers_fail_alone(
    engine: Engine, dsn: str, broker: SourceCase
) -> None:
    """Headers that parse but do not fit the inbox columns must not make the whole batch fail
    to commit (nacked, redelivered, forever: the queue is stuck behind them): each is one
    failed row whose reason names the header, and the good work behind them runs."""
    queue, consumer = unique("bi-"), unique("bi-consumer-")
    create_effects(engine)
    poisons = {}
    for seq, (case, changes, field) in enumerate(OVERSIZED, start=1):
        poison = envelope(queue, case, seq=seq)
        broker.publish_raw(queue, 1, {**poison.wire_headers(), **changes}, poison.wire_body())
        poisons[poison.event_id] = (case, field)
    good = [
        envelope(queue, f"ok-{i}", seq=100 + i, serial_group="g" if i % 2 else None)
        for i in range(4)
    ]
    broker.publish(good)

    # Bounded: with the bug, the worker retries the batch until its time limit
    proc = run_worker(
        dsn, source_url(broker), worker_env(consumer, [queue], ["job"]), time_limit=15
    )

    assert proc.returncode == 0, proc.stderr[-3000:]
    marks = sorted(e.mark for e in effect_rows(engine, consumer))
    assert marks == [f"ok-{i}" for i in range(4)], (
        "good work behind the poison did not run; worker errors: " + _errors(proc.stderr)
    )
    rows = {r.event_id: r for r in inbox_rows(engine, consumer)}
    problems: list[tuple[str, object]] = []
    for event_id, (case, field) in poisons.items():
        row = rows.get(event_id)
        if row is None or row.state != states.FAILED or field not in (row.last_error or ""):
            problems.append((case, None if row is None else (row.state, row.last_error)))
        elif row.duplicates != 0:
            problems.append((case, "redelivered"))
    assert problems == []


def _errors(log: str) -> str:
    """The distinct error lines of a worker log (for the failure message)."""
    lines = [line for line in log.splitlines() if "Error" in line or "error" in line]
    return "\n".join(dict.fromkeys(line.split(": ", 1)[-1][:300] for line in lines[:50]))
