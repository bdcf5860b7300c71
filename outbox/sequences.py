"""Numbers of a sequence key, assigned by ``store()`` in the caller's transaction.

One counter row per key (``<outbox>_sequences``), raised by an upsert that keeps the row
locked until the caller's transaction ends. Numbers are therefore gap-free and unique among
committed messages: a second producer of the key waits for the first to commit (and then
counts on from its numbers) or roll back (and then takes the numbers back); producers of
other keys lock other rows and never wait.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import Connection, Table

from outbox import queries
from outbox.dialect import Dialect


def number(
    conn: Connection, dialect: Dialect, counters: Table, rows: list[dict[str, Any]]
) -> dict[str, int]:
    """Fill ``sequence`` of every row that has a ``sequence_key`` and no number, in row
    order, with one increment per key; returns how many numbers each key took.

    Keys are locked in sorted order, so two batches that share keys take their locks in the
    same order and cannot deadlock each other. Rows with an explicit number keep it and
    leave the counter alone.
    """
    if all(r["sequence_key"] is None for r in rows):
        return {}
    wanted = Counter(
        r["sequence_key"] for r in rows if r["sequence_key"] is not None and r["sequence"] is None
    )
    if not wanted:
        return {}
    following: dict[str, int] = {}
    for key in sorted(wanted):
        following[key] = _take(conn, dialect, counters, key, wanted[key]) - wanted[key] + 1
    for row in rows:
        key = row["sequence_key"]
        if key in wanted and row["sequence"] is None:
            row["sequence"] = following[key]
            following[key] += 1
    return dict(wanted)


def give_back(conn: Connection, counters: Table, taken: dict[str, int]) -> None:
    """Undo ``number`` in the same transaction, for a batch refused after it was numbered."""
    for key, count in taken.items():
        conn.execute(queries.give_back_numbers(counters), {"key": key, "count": count})


def _take(conn: Connection, dialect: Dialect, counters: Table, key: str, count: int) -> int:
    """The key's counter after adding ``count``: the last of the numbers now ours."""
    parameters = {"key": key, "count": count}
    result = conn.execute(queries.take_numbers(dialect, counters), parameters)
    if dialect.returning:
        return int(result.scalar_one())
    return int(conn.execute(queries.last_number(counters), parameters).scalar_one())
