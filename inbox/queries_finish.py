"""The SQL of a claimed row while and after its handler runs: lease renewal and the finish.

Every state change after the claim names the claim token it holds (G9), so a worker whose
claim was taken back cannot finish the row a second time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Table, Update, and_, update

from outbox import states


def _fenced(table: Table, row_id: int, token: Any) -> ColumnElement[bool]:
    """Every state change after the claim names the token it holds (G9)."""
    t = table.c
    return and_(t.id == row_id, t.claim_token == token, t.state == states.PROCESSING)


def renew_lease(table: Table, row_id: int, token: Any, lease_until: datetime) -> Update:
    return update(table).where(_fenced(table, row_id, token)).values(lease_until=lease_until)


def finish_done(table: Table, row_id: int, token: Any, now: datetime) -> Update:
    return (
        update(table)
        .where(_fenced(table, row_id, token))
        .values(state=states.DONE, finished_at=now, lease_until=None, last_error=None)
    )


def finish_failed(
    table: Table,
    row_id: int,
    token: Any,
    *,
    state: str,
    available_at: datetime,
    last_error: str,
    now: datetime,
) -> Update:
    """To retry (due at ``available_at``), failed or halted."""
    finished = None if state == states.RETRY else now
    return (
        update(table)
        .where(_fenced(table, row_id, token))
        .values(
            state=state,
            available_at=available_at,
            last_error=last_error,
            lease_until=None,
            finished_at=finished,
        )
    )
