"""The operator core that the outbox and the inbox commands share: rows as JSON, failed rows
by filter, one row, rows requeued under lock with an audit record, batched deletes.

Each side (``outbox.ops.admin``, ``inbox.ops.admin``) passes its own statements, from its
queries module, and keeps only what differs (the inbox's groups, unblock, head-pass marks).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Delete, Engine, Row, Select, Table, Update

from outbox.dialect import dialect_of
from outbox.ops import queries as q

# Ids per UPDATE/DELETE ... WHERE id IN (...): far under every driver's parameter limit.
ID_CHUNK = 1000
MAX_DELETE_BATCH = 20000  # SQLite allows 32766 bound parameters per statement
# Rows per delete transaction of compact and prune unless told otherwise.
DELETE_BATCH = 10000

Progress = Callable[[int], None]


def no_progress(_n: int) -> None:
    """The progress callback of callers that show none."""


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool, dict, list)):
        return value
    return str(value)  # UUIDs


def chunks(items: Sequence[Any], size: int = ID_CHUNK) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def fetch_rows(engine: Engine, stmt: Select[Any]) -> list[dict[str, Any]]:
    """Every row of ``stmt`` as a JSON-ready dict (the failed-rows listings)."""
    with engine.connect() as conn:
        return [{k: jsonable(v) for k, v in row._mapping.items()} for row in conn.execute(stmt)]


def fetch_row(engine: Engine, stmt: Select[Any]) -> dict[str, Any] | None:
    """The first row of ``stmt`` as a JSON-ready dict, or None (``--show ID``)."""
    with engine.connect() as conn:
        row = conn.execute(stmt).first()
    if row is None:
        return None
    return {k: jsonable(v) for k, v in row._mapping.items()}


def locking_reads(engine: Engine) -> Connection:
    """A connection for SELECT ... FOR UPDATE over a range the operator chose.

    MySQL/MariaDB: READ COMMITTED. Under InnoDB's default REPEATABLE READ a locking read locks
    every row and gap it scans, not only the rows that match: selecting failed or sent rows
    would hold the gaps where producers insert new pending rows and where the relay marks
    rows sent, stalling both until the operator's transaction ends (the relay runs READ
    COMMITTED for the same reason). PostgreSQL is READ COMMITTED already; SQLite has one
    writer whatever the level."""
    return dialect_of(engine).read_committed(engine).connect()


def check_reason(reason: str) -> None:
    if not reason.strip():
        raise ValueError("reason: must not be empty")


def wanted_ids(ids: Sequence[int] | None) -> list[int] | None:
    """The ids asked for, sorted and once each; None: every row the filters match."""
    return sorted(set(ids)) if ids is not None else None


@dataclass(frozen=True)
class Selection:
    rows: list[Row[Any]]  # what the select of each chunk returned, locked unless a dry run
    ids: list[int]
    not_matched: list[int]  # asked for by id but not selected


def select_locked(
    conn: Connection,
    wanted: list[int] | None,
    select_chunk: Callable[[Sequence[int] | None], Select[Any]],
    dry_run: bool,
) -> Selection:
    """The rows ``select_chunk`` picks, ``ID_CHUNK`` asked-for ids per statement (one
    statement when ``wanted`` is None), locked while read unless ``dry_run``, so what is
    changed and audited next is exactly what was read."""
    rows: list[Row[Any]] = []
    for chunk in chunks(wanted) if wanted is not None else [None]:
        rows.extend(conn.execute(q.for_update(select_chunk(chunk), conn, not dry_run)).all())
    ids = [int(r.id) for r in rows]
    not_matched = sorted(set(wanted) - set(ids)) if wanted is not None else []
    return Selection(rows, ids, not_matched)


def update_chunks(
    conn: Connection,
    ids: Sequence[int],
    update_chunk: Callable[[Sequence[int]], Update],
    progress: Progress,
) -> None:
    for chunk in chunks(ids):
        conn.execute(update_chunk(chunk))
        progress(len(chunk))


def insert_audit(
    conn: Connection,
    audit: Table,
    *,
    now: datetime,
    actor: str,
    action: str,
    target: str,
    reason: str,
    row_count: int,
    row_ids: Any,
) -> None:
    """One audit record; ``row_ids`` is stored as JSON."""
    conn.execute(
        q.audit_insert(
            audit, at=now, actor=actor, action=action, target=target, reason=reason,
            row_count=row_count, row_ids=json.dumps(row_ids),
        )
    )  # fmt: skip


# Candidate audit records read per statement while looking for one row's history.
AUDIT_SCAN = 200


def audit_history(
    engine: Engine, audit: Table, target: str, row_id: int, limit: int = 50
) -> list[dict[str, Any]]:
    """The newest ``limit`` audit records of ``target`` (``outbox`` or ``inbox``) that name
    row ``row_id``, newest first, ``row_ids`` decoded: what the operators did to that row.

    ``row_ids`` holds ids (the outbox) or ``{"id": ...}`` objects (the inbox); the query's
    text match only narrows the candidates, the ids are compared here."""
    found: list[dict[str, Any]] = []
    offset = 0
    with engine.connect() as conn:
        while len(found) < limit:
            page = conn.execute(q.audit_mentioning(audit, target, row_id, AUDIT_SCAN, offset)).all()
            for record in page:
                if row_id in _audited_ids(record.row_ids):
                    found.append({k: jsonable(v) for k, v in record._mapping.items()})
            if len(page) < AUDIT_SCAN:
                break
            offset += AUDIT_SCAN
    return found[:limit]


def _audited_ids(row_ids: Any) -> set[int]:
    if isinstance(row_ids, str):  # a driver that hands the JSON back as text
        row_ids = json.loads(row_ids)
    ids: set[int] = set()
    for item in row_ids if isinstance(row_ids, list) else []:
        value = item.get("id") if isinstance(item, dict) else item
        if isinstance(value, int) and not isinstance(value, bool):
            ids.add(value)
    return ids


@dataclass(frozen=True)
class DeleteResult:
    deleted: int
    batches: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.deleted / self.seconds if self.seconds > 0 else 0.0


def check_batch(batch: int) -> None:
    if not 1 <= batch <= MAX_DELETE_BATCH:
        raise ValueError(f"batch: must be between 1 and {MAX_DELETE_BATCH}, got {batch}")


def delete_in_batches(
    engine: Engine,
    batch_ids: Select[Any],
    delete_chunk: Callable[[Sequence[int]], Delete],
    *,
    batch: int,
    progress: Progress,
    max_batches: int | None,
) -> DeleteResult:
    """Up to ``batch`` ids from ``batch_ids``, then their delete, per short transaction,
    until a batch comes back short; ``progress`` gets the rows each batch deleted."""
    check_batch(batch)
    started = time.perf_counter()
    deleted = batches = 0
    while max_batches is None or batches < max_batches:
        with engine.begin() as conn:
            ids = [int(i) for i in conn.execute(batch_ids).scalars()]
            if not ids:
                break
            n = sum(conn.execute(delete_chunk(chunk)).rowcount for chunk in chunks(ids))
        deleted += n
        batches += 1
        progress(n)
        if len(ids) < batch:
            break
    return DeleteResult(deleted, batches, time.perf_counter() - started)
