"""Per-key publish order (G10): which rows of a batch may go out, and in which waves.

A key is (queue, priority, key): its rows are published in id order, a row waiting out a
backoff holds back the later rows of its key, and a key's next row goes out only after the
broker confirmed its previous one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row


def due_prefixes(rows: Sequence[Row[Any]], now: datetime) -> list[Row[Any]]:
    """Per (queue, priority, key), the rows in id order up to the first one not due yet:
    a row waiting out a backoff or a delay holds back the rest of its key."""
    blocked: set[tuple[str, int, str]] = set()
    out: list[Row[Any]] = []
    for row in sorted(rows, key=lambda r: r.id):
        if chain(row) in blocked:
            continue
        if row.available_at > now:
            blocked.add(chain(row))
            continue
        out.append(row)
    return out


def waves(rows: Sequence[Row[Any]]) -> list[list[Row[Any]]]:
    """Split a batch so that each wave holds at most one row per key, in id order: wave n
    has the n-th row of every key; rows without a key all go in wave 0."""
    depth: dict[tuple[str, int, str], int] = {}
    out: list[list[Row[Any]]] = []
    for row in sorted(rows, key=lambda r: (r.priority, r.id)):
        index = 0
        if row.key is not None:
            index = depth.get(chain(row), 0)
            depth[chain(row)] = index + 1
        while len(out) <= index:
            out.append([])
        out[index].append(row)
    return out


def chain(row: Row[Any]) -> tuple[str, int, str]:
    return (row.queue, row.priority, row.key)
