"""The SQL of one failed or gate-decided claim's finish (the batch's done marks and lease
renewals are ``inbox.sql.claims``'s).

Every state change after the claim names the claim token it holds (G9), so a worker whose
claim was taken back cannot finish the row a second time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Table, Update, and_, update

from outbox import states
from outbox.queries import per_row


def _fenced(table: Table, row_id: int, token: Any) -> ColumnElement[bool]:
    """Every state change after the claim names the token it holds (G9). The row is found by
    its id; its state is checked on that row (``per_row``)."""
    t = table.c
    return and_(t.id == row_id, t.claim_token == token, per_row(t.state) == states.PROCESSING)


def finish_failed(
    table: Table,
    row_id: int,
    token: Any,
    *,
    state: str,
    available_at: datetime,
    last_error: str | None,
    now: datetime,
    reason: str | None = None,
    next_check: str | None = None,
    ran: bool = True,
) -> Update:
    """To retry (due at ``available_at``), failed, halted, or a state of the message contract
    (deferred, stale, review, unknown, done as a duplicate effect) with its ``reason`` and
    ``next_check``. ``ran=False``: decided before the handler ran, so the claim's attempt is
    given back (attempts count handler runs)."""
    t = table.c
    finished = now if state in FINISHED_STATES else None
    values: dict[str, Any] = {
        "state": state,
        "available_at": available_at,
        "last_error": last_error,
        "lease_until": None,
        "finished_at": finished,
        "reason": reason,
        "next_check": next_check,
    }
    if not ran:
        values["attempts"] = t.attempts - 1
    return update(table).where(_fenced(table, row_id, token)).values(values)


# States a finish ends the message in (``finished_at`` set; prune may delete them later).
FINISHED_STATES = (states.DONE, states.FAILED, states.HALTED, states.STALE)
