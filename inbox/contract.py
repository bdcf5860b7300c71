"""The message contract's rules on the consumer side, as pure functions (docs/contract.md).

A message may carry an effect key (the effect that must never happen twice), a sequence key
and number (the order of one object's changes) and a schema version. Before a handler runs,
the consumer decides from them: apply, stale (the number was applied already), gap (a
predecessor is missing: deferred, then review), unsupported schema (review). After a failed
run it decides between retry, dead, review and unknown. What cannot be decided
automatically goes to the manual route (``outbox inbox review`` / ``resolve``) with its
reason; nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

# ``inbox.reason`` values.
SEQUENCE_GAP: Final = "sequence-gap"  # a predecessor never arrived within the gap timeout
UNSUPPORTED_SCHEMA: Final = "unsupported-schema"  # the handler does not accept the version
NOT_TRANSIENT: Final = "not-transient"  # an error outside the consumer's transient errors
EFFECT_UNKNOWN: Final = "effect-unknown"  # the handler raised EffectUnknown
STALE_NUMBER: Final = "stale"  # the key's number was applied already
DUPLICATE_EFFECT: Final = "duplicate-effect"  # another event id applied this effect key
SKIPPED: Final = "skipped"  # an operator resolved it with --skip
REASONS: Final = (
    SEQUENCE_GAP, UNSUPPORTED_SCHEMA, NOT_TRANSIENT, EFFECT_UNKNOWN, STALE_NUMBER,
    DUPLICATE_EFFECT, SKIPPED,
)  # fmt: skip


class EffectUnknown(Exception):
    """Raise from a handler when the effect's outcome is not known: an external call whose
    answer was lost may or may not have taken effect. The message goes to state ``unknown``
    (never retried automatically, its serial group and sequence key held) with ``check``:
    what an operator must verify before ``outbox inbox resolve`` (e.g. "look up the payment
    by idempotency key invoice-417")."""

    def __init__(self, message: str, *, check: str) -> None:
        if not isinstance(check, str) or not check.strip():
            raise ValueError("check: say what must be verified before resolving")
        super().__init__(message)
        self.check = check


Verdict = Literal["apply", "stale", "gap"]


def sequence_verdict(number: int, last: int) -> Verdict:
    """Change ``number`` of a key whose last applied number is ``last``."""
    if number <= last:
        return "stale"
    if number > last + 1:
        return "gap"
    return "apply"


@dataclass(frozen=True)
class GapDecision:
    review: bool  # True: to review (reason sequence-gap); False: deferred until ``until``
    until: datetime


def after_gap(
    received_at: datetime, now: datetime, timeout: float, predecessor_kept: bool
) -> GapDecision:
    """A change whose predecessor is not applied. It waits ``timeout`` seconds from its
    receipt; past that it goes to review, unless the predecessor is in the inbox (running,
    due again, held for review): then it is not lost, and the change waits for it (the
    predecessor's apply frees it at once)."""
    deadline = received_at + timedelta(seconds=timeout)
    if now < deadline:
        return GapDecision(False, deadline)
    if predecessor_kept:
        return GapDecision(False, now + timedelta(seconds=timeout))
    return GapDecision(True, now)


def accepts_version(accepted: Collection[str] | None, version: str | None) -> bool:
    """A handler registered with ``versions`` takes only those (a message without a version
    is not one of them); without ``versions`` it takes any."""
    return accepted is None or (version is not None and version in accepted)


FailureKind = Literal["transient", "permanent", "unclassified", "unknown"]


def failure_kind(
    error: BaseException,
    *,
    permanent: tuple[type[BaseException], ...],
    transient: tuple[type[BaseException], ...] | None,
) -> FailureKind:
    """What a handler's exception is. ``transient``: when set (non-empty), only those retry
    and anything else is unclassified (review at once: an unsure classification keeps the
    message for a person, it does not loop)."""
    if isinstance(error, EffectUnknown):
        return "unknown"
    if isinstance(error, permanent):
        return "permanent"
    if transient and not isinstance(error, transient):
        return "unclassified"
    return "transient"
