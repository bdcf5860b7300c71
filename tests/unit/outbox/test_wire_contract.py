"""The message contract on the wire: effect key, sequence key and number, payload schema."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace
from uuid import uuid4

import pytest

from outbox import wire
from outbox.wire import Envelope, MalformedMessageError, envelope_from_row, from_wire

Headers = dict[str, str]


def _envelope(**contract: object) -> Envelope:
    return Envelope(
        event_id=uuid4(),
        type="invoice.reminder",
        queue="billing",
        priority=1,
        outbox_id=7,
        occurred_at=datetime(2026, 3, 1, 9, tzinfo=UTC),
        body='{"invoice":"417"}',
        headers={"trace": "t-1"},
        **contract,  # type: ignore[arg-type]
    )


FULL = {
    "effect_key": "invoice-417:reminder",
    "sequence_key": "invoice-417",
    "sequence": 4,
    "schema_version": "2021-03",
}


def test_the_four_headers_are_written_and_read_back() -> None:
    env = _envelope(**FULL)
    headers = env.wire_headers()
    assert headers[wire.H_EFFECT_KEY] == "invoice-417:reminder"
    assert headers[wire.H_SEQUENCE_KEY] == "invoice-417"
    assert headers[wire.H_SEQUENCE] == "4"
    assert headers[wire.H_PAYLOAD_SCHEMA] == "2021-03"
    # The envelope format's own version is another header, unchanged
    assert headers[wire.H_SCHEMA_VERSION] == wire.SCHEMA_VERSION
    raw = {k: v.encode() for k, v in headers.items()}  # brokers may hand bytes
    back = from_wire(raw, env.wire_body())
    assert back == env
    assert (back.effect_key, back.sequence_key, back.sequence, back.schema_version) == (
        "invoice-417:reminder",
        "invoice-417",
        4,
        "2021-03",
    )
    assert back.headers == {"trace": "t-1"}


def test_headers_are_written_only_when_set() -> None:
    env = _envelope()
    headers = env.wire_headers()
    for name in (wire.H_EFFECT_KEY, wire.H_SEQUENCE_KEY, wire.H_SEQUENCE, wire.H_PAYLOAD_SCHEMA):
        assert name not in headers
    back = from_wire(headers, env.wire_body())
    assert back == env
    assert (back.effect_key, back.sequence_key, back.sequence, back.schema_version) == (None,) * 4
    # Each field alone (a sequence key always with its number)
    for fields in (
        {"effect_key": "e"},
        {"schema_version": "2"},
        {"sequence_key": "k", "sequence": 1},
    ):
        single = _envelope(**fields)
        assert from_wire(single.wire_headers(), single.wire_body()) == single


def test_largest_values_round_trip() -> None:
    env = _envelope(
        effect_key="e" * 255, sequence_key="s" * 255, sequence=2**63 - 1, schema_version="v" * 255
    )
    assert from_wire(env.wire_headers(), env.wire_body()) == env


def test_application_headers_under_our_prefix_are_never_sent_as_ours() -> None:
    # A row written by hand may hold them; store() refuses them, the wire drops them
    env = replace(
        _envelope(),
        headers={"outbox-sequence": "9", "Outbox-Effect-Key": "forged", "trace": "t"},
    )
    headers = env.wire_headers()
    assert wire.H_SEQUENCE not in headers and "Outbox-Effect-Key" not in headers
    assert headers["trace"] == "t"
    # And ours win over an application header of the same name
    keyed = replace(_envelope(**FULL), headers={"outbox-sequence": "9"})
    assert keyed.wire_headers()[wire.H_SEQUENCE] == "4"


def test_received_headers_under_our_prefix_are_not_application_headers() -> None:
    headers = _envelope().wire_headers()
    headers["OUTBOX-whatever"] = "x"
    headers["x-app"] = "y"
    assert from_wire(headers, b"{}").headers == {"trace": "t-1", "x-app": "y"}


def _set(name: str, value: str) -> Callable[[Headers], None]:
    return lambda h: h.update({name: value})


def _drop(name: str) -> Callable[[Headers], None]:
    return lambda h: h.pop(name) and None


MALFORMED: list[tuple[str, Callable[[Headers], None], str, str]] = [
    ("sequence not a number", _set(wire.H_SEQUENCE, "four"), wire.H_SEQUENCE, "not an integer"),
    ("sequence empty", _set(wire.H_SEQUENCE, ""), wire.H_SEQUENCE, "not an integer"),
    ("sequence decimal", _set(wire.H_SEQUENCE, "4.0"), wire.H_SEQUENCE, "not an integer"),
    ("sequence signed", _set(wire.H_SEQUENCE, "+4"), wire.H_SEQUENCE, "not an integer"),
    ("sequence padded", _set(wire.H_SEQUENCE, " 4"), wire.H_SEQUENCE, "not an integer"),
    ("sequence underscore", _set(wire.H_SEQUENCE, "4_0"), wire.H_SEQUENCE, "not an integer"),
    ("sequence other digits", _set(wire.H_SEQUENCE, "\u0664"), wire.H_SEQUENCE, "not an integer"),
    ("sequence negative", _set(wire.H_SEQUENCE, "-1"), wire.H_SEQUENCE, "not an integer"),
    ("sequence zero", _set(wire.H_SEQUENCE, "0"), wire.H_SEQUENCE, "outside 1.."),
    ("sequence over bigint", _set(wire.H_SEQUENCE, str(2**63)), wire.H_SEQUENCE, "outside 1.."),
    ("sequence huge", _set(wire.H_SEQUENCE, "9" * 5000), wire.H_SEQUENCE, "not an integer"),
    ("sequence without key", _drop(wire.H_SEQUENCE_KEY), wire.H_SEQUENCE, "without"),
    ("key without sequence", _drop(wire.H_SEQUENCE), wire.H_SEQUENCE, "header missing"),
    ("sequence key too long", _set(wire.H_SEQUENCE_KEY, "s" * 256), wire.H_SEQUENCE_KEY, "256"),
    ("sequence key empty", _set(wire.H_SEQUENCE_KEY, ""), wire.H_SEQUENCE_KEY, "0 characters"),
    ("sequence key padded", _set(wire.H_SEQUENCE_KEY, "k "), wire.H_SEQUENCE_KEY, "whitespace"),
    ("effect key too long", _set(wire.H_EFFECT_KEY, "e" * 256), wire.H_EFFECT_KEY, "256"),
    ("effect key empty", _set(wire.H_EFFECT_KEY, ""), wire.H_EFFECT_KEY, "0 characters"),
    ("effect key padded", _set(wire.H_EFFECT_KEY, "\te"), wire.H_EFFECT_KEY, "whitespace"),
    ("schema too long", _set(wire.H_PAYLOAD_SCHEMA, "v" * 256), wire.H_PAYLOAD_SCHEMA, "256"),
    ("schema empty", _set(wire.H_PAYLOAD_SCHEMA, ""), wire.H_PAYLOAD_SCHEMA, "0 characters"),
    ("schema padded", _set(wire.H_PAYLOAD_SCHEMA, "v2 "), wire.H_PAYLOAD_SCHEMA, "whitespace"),
]


@pytest.mark.parametrize(
    ("case", "mutate", "field", "reason"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
def test_malformed_contract_headers_name_the_header(
    case: str, mutate: Callable[[Headers], None], field: str, reason: str
) -> None:
    headers = _envelope(**FULL).wire_headers()
    mutate(headers)
    with pytest.raises(MalformedMessageError) as raised:
        from_wire(headers, b"{}")
    assert raised.value.field == field
    assert reason in raised.value.reason
    assert str(raised.value).startswith(f"{field}: ")


def test_envelope_from_row_reads_the_contract_columns() -> None:
    row = SimpleNamespace(
        id=12,
        event_id=uuid4(),
        type="t",
        queue="q",
        priority=2,
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        payload={"a": 1},
        serial_group=None,
        key=None,
        headers={},
        **FULL,
    )
    env = envelope_from_row(vars(row))
    assert (env.effect_key, env.sequence_key, env.sequence, env.schema_version) == (
        "invoice-417:reminder",
        "invoice-417",
        4,
        "2021-03",
    )
    plain = envelope_from_row({**vars(row), **dict.fromkeys(FULL)})  # all four NULL
    assert (
        plain.wire_headers()
        .keys()
        .isdisjoint(
            {wire.H_EFFECT_KEY, wire.H_SEQUENCE_KEY, wire.H_SEQUENCE, wire.H_PAYLOAD_SCHEMA}
        )
    )
