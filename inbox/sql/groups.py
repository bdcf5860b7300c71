"""The SQL of the per-group state (``<inbox>_groups``, see ``outbox/schema.py``).

A group is marked blind: an upsert that never reads the row first, so two transactions
marking one group cannot undo each other, whatever their snapshots. Only the head pass
clears a mark, and it clears before it reads the group's rows: it clears only the rows it
could lock (a row a transaction is marking right now stays marked), and the read that
follows, a later transaction, sees what every earlier marker committed; a mark set after
the clear stays for the next pass.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import Insert, Integer, Select, Table, Update, bindparam, select, true, update

from outbox.dialect import Dialect
from outbox.queries import one_of


@lru_cache(maxsize=16)
def mark(table: Table, dialect: Dialect) -> Insert:
    """Executed with one ``{"consumer", "serial_group", "needs_check": True}`` per group.
    The new value is a literal, not a parameter: PyMySQL's executemany cannot take a
    parameter after VALUES (...) (it rewrites the statement into one multi-row INSERT)."""
    keys = [table.c.consumer, table.c.serial_group]
    return dialect.upsert(table, keys, {"needs_check": true()})


@lru_cache(maxsize=16)
def to_check(table: Table, dialect: Dialect, first: bool) -> Select[Any]:
    """Up to ``limit`` marked groups of ``consumer`` in name order (an index range, however
    many groups the consumer has), after ``after`` unless ``first``; each row locked
    ``SKIP LOCKED``: a row a marker holds is left marked, so the clear never waits for a
    marker (nor a marker, locking its groups in another order, for the clear). SQLite:
    one writer, nothing to skip. Parameters: consumer, after, limit."""
    t = table.c
    conditions = [t.consumer == bindparam("consumer"), t.needs_check == true()]
    if not first:
        conditions.append(t.serial_group > bindparam("after"))
    stmt = (
        select(t.serial_group)
        .where(*conditions)
        .order_by(t.serial_group)
        .limit(bindparam("limit", type_=Integer))
    )
    return dialect.skip_locked(stmt)


@lru_cache(maxsize=16)
def clear(table: Table, *, arrays: bool) -> Update:
    """Parameters: of_consumer, groups (a list: one array with ``arrays``, see
    ``outbox.queries.one_of``). (Not ``consumer``: in an UPDATE a parameter named as a column
    is taken for that column's new value.)"""
    t = table.c
    return (
        update(table)
        .where(
            t.consumer == bindparam("of_consumer"),
            one_of(t.serial_group, "groups", arrays=arrays),
        )
        .values(needs_check=False)
    )
