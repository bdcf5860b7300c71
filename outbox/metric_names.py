"""Every metric name the relay, the worker and ``outbox metrics`` export, defined once (they
are public: dashboards and alert rules use them; keep them stable), and the values of
``inbox_processed_total{result}``. ``outbox.metrics`` re-exports them all."""

from __future__ import annotations

from typing import Final

# In-process counters and histograms (outbox.metrics.Metrics).
PUBLISHED_TOTAL: Final = "outbox_published_total"
PUBLISH_ERRORS_TOTAL: Final = "outbox_publish_errors_total"
RELAY_BATCH_SECONDS: Final = "outbox_relay_batch_seconds"
DELIVERY_LAG_SECONDS: Final = "outbox_delivery_lag_seconds"
INBOX_PROCESSED_TOTAL: Final = "inbox_processed_total"
INBOX_DUPLICATES_TOTAL: Final = "inbox_duplicates_total"
INBOX_HANDLER_SECONDS: Final = "inbox_handler_seconds"
INBOX_END_TO_END_SECONDS: Final = "inbox_end_to_end_seconds"
# Database-derived gauges (outbox.ops.gauges.DatabaseGauges).
PENDING_COUNT: Final = "outbox_pending_count"
PENDING_SECONDS: Final = "outbox_pending_seconds"
FAILED_COUNT: Final = "outbox_failed_count"
INBOX_WAITING_COUNT: Final = "inbox_waiting_count"
INBOX_PROCESSING_COUNT: Final = "inbox_processing_count"
INBOX_FAILED_COUNT: Final = "inbox_failed_count"
INBOX_REVIEW_COUNT: Final = "inbox_review_count"
INBOX_UNKNOWN_COUNT: Final = "inbox_unknown_count"
INBOX_GROUP_BLOCKED_SECONDS: Final = "inbox_group_blocked_seconds"
GAUGES_REFRESH_SECONDS: Final = "outbox_gauges_refresh_seconds"
GAUGES_REFRESH_ERRORS_TOTAL: Final = "outbox_gauges_refresh_errors_total"

# ``inbox_processed_total{result}`` values.
RESULT_DONE: Final = "done"  # the handler's effect committed
RESULT_RETRY: Final = "retry"  # the handler failed; the message is due again later
RESULT_FAILED: Final = "failed"  # dead: attempts exhausted, permanent error or unknown type
# The message contract (docs/contract.md): off the automatic path, or never to be applied.
RESULT_REVIEW: Final = "review"  # kept for a person (schema, gap, an error not transient)
RESULT_UNKNOWN: Final = "unknown"  # the handler raised EffectUnknown
RESULT_STALE: Final = "stale"  # its sequence number was applied already: not applied
RESULTS: Final = (
    RESULT_DONE,
    RESULT_RETRY,
    RESULT_FAILED,
    RESULT_REVIEW,
    RESULT_UNKNOWN,
    RESULT_STALE,
)

# ``inbox_duplicates_total{key}``: which key found the message a duplicate.
DUPLICATE_BY_EVENT_ID: Final = "event_id"  # a redelivery of one (event_id, consumer)
DUPLICATE_BY_EFFECT_KEY: Final = "effect_key"  # another event id with an applied effect key
DUPLICATE_KEYS: Final = (DUPLICATE_BY_EVENT_ID, DUPLICATE_BY_EFFECT_KEY)

IN_PROCESS_NAMES: Final = (
    PUBLISHED_TOTAL, PUBLISH_ERRORS_TOTAL, RELAY_BATCH_SECONDS, DELIVERY_LAG_SECONDS,
    INBOX_PROCESSED_TOTAL, INBOX_DUPLICATES_TOTAL, INBOX_HANDLER_SECONDS,
    INBOX_END_TO_END_SECONDS,
)  # fmt: skip
DATABASE_GAUGE_NAMES: Final = (
    PENDING_COUNT, PENDING_SECONDS, FAILED_COUNT, INBOX_WAITING_COUNT, INBOX_PROCESSING_COUNT,
    INBOX_FAILED_COUNT, INBOX_REVIEW_COUNT, INBOX_UNKNOWN_COUNT, INBOX_GROUP_BLOCKED_SECONDS,
    GAUGES_REFRESH_SECONDS, GAUGES_REFRESH_ERRORS_TOTAL,
)  # fmt: skip
ALL_NAMES: Final = (*IN_PROCESS_NAMES, *DATABASE_GAUGE_NAMES)

__all__ = [
    "ALL_NAMES",
    "DATABASE_GAUGE_NAMES",
    "DELIVERY_LAG_SECONDS",
    "DUPLICATE_BY_EFFECT_KEY",
    "DUPLICATE_BY_EVENT_ID",
    "DUPLICATE_KEYS",
    "FAILED_COUNT",
    "GAUGES_REFRESH_ERRORS_TOTAL",
    "GAUGES_REFRESH_SECONDS",
    "INBOX_DUPLICATES_TOTAL",
    "INBOX_END_TO_END_SECONDS",
    "INBOX_FAILED_COUNT",
    "INBOX_GROUP_BLOCKED_SECONDS",
    "INBOX_HANDLER_SECONDS",
    "INBOX_PROCESSED_TOTAL",
    "INBOX_PROCESSING_COUNT",
    "INBOX_REVIEW_COUNT",
    "INBOX_UNKNOWN_COUNT",
    "INBOX_WAITING_COUNT",
    "IN_PROCESS_NAMES",
    "PENDING_COUNT",
    "PENDING_SECONDS",
    "PUBLISHED_TOTAL",
    "PUBLISH_ERRORS_TOTAL",
    "RELAY_BATCH_SECONDS",
    "RESULTS",
    "RESULT_DONE",
    "RESULT_FAILED",
    "RESULT_RETRY",
    "RESULT_REVIEW",
    "RESULT_STALE",
    "RESULT_UNKNOWN",
]  # fmt: skip
