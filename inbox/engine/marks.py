"""Marking groups for the head-of-group pass (``<inbox>_groups.needs_check``).

Called inside every transaction that may leave a group's head waiting with nothing
running, with the groups it touched: a finish frees its group; a claim that set rows waiting
saw the group busy, and the row that kept it busy may have finished since; an unblock frees
a halted group. The head pass reads only marked groups (``HeadPass.head_pass``).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, Table
from sqlalchemy.orm import Session

from inbox.sql import groups as queries_groups
from outbox.dialect import dialect_of


def mark_groups(
    conn: Connection | Session, table: Table, consumer: str, groups: Iterable[str | None]
) -> None:
    """Mark ``groups`` (None, an ungrouped row's, is left out). In name order, so that two
    transactions marking some of the same groups take the row locks in the same order."""
    names = sorted({g for g in groups if g is not None})
    if names:
        rows = [{"consumer": consumer, "serial_group": g, "needs_check": True} for g in names]
        conn.execute(queries_groups.mark(table, dialect_of(conn)), rows)
