"""Per-key publish order (G10): which rows of a batch may go out, and in which waves.

A key is (queue, priority, key): its rows are published in id order, a row waiting out a
backoff holds back the later rows of its key, and a key's next row goes out only after the
broker confirmed its previous one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import RowMapping


def due_prefixes(rows: Sequence[RowMapping], now: datetime) -> list[RowMapping]:
    """Per (queue, priority, key), the rows in id order up to the first one not due yet:
    a row waiting out a backoff or a delay holds back the rest of its key."""
    blocked: set[tuple[str, int, str]] = set()
    out: list[RowMapping] = []
    for row in sorted(rows, key=lambda r: r["id"]):
        if chain(row) in blocked:
            continue
        if row["available_at"] > now:
            blocked.add(chain(row))
            continue
        out.append(row)
    return out


def waves(rows: Sequence[RowMapping]) -> list[list[RowMapping]]:
    """Split a batch so that each wave holds at most one row per key, in id order: wave n
    has the n-th row of every key; rows without a key all go in wave 0."""
    depth: dict[tuple[str, int, str], int] = {}
    out: list[list[RowMapping]] = []
    for row in sorted(rows, key=lambda r: (r["priority"], r["id"])):
        index = 0
        if row["key"] is not None:
            index = depth.get(chain(row), 0)
            depth[chain(row)] = index + 1
        while len(out) <= index:
            out.append([])
        out[index].append(row)
    return out


def chain(row: RowMapping) -> tuple[str, int, str]:
    return (row["queue"], row["priority"], row["key"])
