"""The message contract's pure rules (inbox/contract.py) and the consumer options that feed
them, without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inbox import Consumer, EffectUnknown
from inbox.contract import accepts_version, after_gap, failure_kind, sequence_verdict
from inbox.rules import after_failure
from outbox import states
from outbox.backoff import Backoff
from outbox.errors import ConfigError

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@given(st.integers(0, 10**6), st.integers(-5, 5))
def test_exactly_the_next_number_applies(last: int, offset: int) -> None:
    verdict = sequence_verdict(last + offset, last)
    expected = "apply" if offset == 1 else "stale" if offset <= 0 else "gap"
    assert verdict == expected


def test_a_gap_waits_its_timeout_from_receipt_then_goes_to_review() -> None:
    early = after_gap(T0, T0 + timedelta(seconds=10), 30, predecessor_kept=False)
    assert not early.review and early.until == T0 + timedelta(seconds=30)
    late = after_gap(T0, T0 + timedelta(seconds=30), 30, predecessor_kept=False)
    assert late.review


def test_a_gap_whose_predecessor_is_kept_waits_again() -> None:
    now = T0 + timedelta(seconds=31)
    decision = after_gap(T0, now, 30, predecessor_kept=True)
    assert not decision.review and decision.until == now + timedelta(seconds=30)


@pytest.mark.parametrize(
    ("accepted", "version", "expected"),
    [
        (None, None, True),
        (None, "x", True),
        ({"2021-03"}, "2021-03", True),
        ({"2021-03"}, "2024-01", False),
        ({"2021-03"}, None, False),
    ],
)
def test_versions(accepted: set[str] | None, version: str | None, expected: bool) -> None:
    assert accepts_version(accepted, version) is expected


class Flaky(Exception):
    pass


def test_failure_kinds() -> None:
    unknown = EffectUnknown("lost", check="look it up")
    assert failure_kind(unknown, permanent=(), transient=(Flaky,)) == "unknown"
    assert failure_kind(KeyError(), permanent=(KeyError,), transient=(Flaky,)) == "permanent"
    assert failure_kind(Flaky(), permanent=(), transient=(Flaky,)) == "transient"
    assert failure_kind(ValueError(), permanent=(), transient=(Flaky,)) == "unclassified"
    # Without transient errors every error retries, as before
    assert failure_kind(ValueError(), permanent=(), transient=()) == "transient"


@pytest.mark.parametrize(
    ("kind", "state", "reason"),
    [
        ("unknown", states.UNKNOWN, "effect-unknown"),
        ("unclassified", states.REVIEW, "not-transient"),
        ("permanent", states.FAILED, None),
        ("transient", states.RETRY, None),
    ],
)
def test_after_failure_by_kind(kind: str, state: str, reason: str | None) -> None:
    decided = after_failure(
        1,
        max_attempts=3,
        on_dead="continue",
        backoff=Backoff.fixed(1),
        kind=kind,  # type: ignore[arg-type]
    )
    assert (decided.state, decided.reason) == (state, reason)


def test_unknown_and_review_are_not_retried_even_on_the_first_attempt() -> None:
    for kind in ("unknown", "unclassified"):
        decided = after_failure(
            1,
            max_attempts=10,
            on_dead="halt",
            backoff=Backoff.fixed(1),
            kind=kind,  # type: ignore[arg-type]
        )
        assert decided.state in states.MANUAL_STATES and decided.delay == timedelta(0)


def test_consumer_options_are_checked_by_name() -> None:
    with pytest.raises(ConfigError, match="transient_errors"):
        Consumer("c", queues=["q"], transient_errors=["ValueError"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="transient_errors"):
        Consumer("c", queues=["q"], transient_errors=ValueError)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sequence_gap_timeout"):
        Consumer("c", queues=["q"], sequence_gap_timeout=0)
    with pytest.raises(ConfigError, match=r"queue_policies\['q'\].transient_errors"):
        Consumer("c", queues=["q"], queue_policies={"q": {"transient_errors": [1]}})
    consumer = Consumer("c", queues=["q"])
    with pytest.raises(ConfigError, match="versions"):
        consumer.handler("t", versions="2021-03")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="versions"):
        consumer.handler("t", versions=set())
    with pytest.raises(ConfigError, match="versions"):
        consumer.handler("t", versions={""})


def test_per_queue_transient_errors() -> None:
    consumer = Consumer(
        "c",
        queues=["a", "b"],
        transient_errors=[Flaky],
        queue_policies={"b": {"transient_errors": [ValueError]}},
    )
    assert consumer.failure_kind(ValueError(), "a") == "unclassified"
    assert consumer.failure_kind(ValueError(), "b") == "transient"
    assert consumer.failure_kind(Flaky(), "b") == "unclassified"


def test_effect_unknown_keeps_its_check() -> None:
    error = EffectUnknown("provider timed out", check="look up payment 417")
    assert str(error) == "provider timed out" and error.check == "look up payment 417"
