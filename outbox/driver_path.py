"""``store()``'s insert sent on the DBAPI cursor of the caller's connection.

``Connection.execute`` of a cached statement still builds an execution context, processes
parameters and wraps the result: on PostgreSQL that was a third of one ``store()``
(bench/store.py). The statement here is compiled once from the SQLAlchemy construct
(``outbox.queries.driver_statement``); values only ever travel as parameters.

Used only where it changes nothing the caller can see: psycopg 3 (sync), an active
transaction (savepoint included) already begun, no ``schema_translate_map``, no SQL logging
(``echo`` or the ``sqlalchemy.engine`` logger at INFO) and no event listener that
``Connection.execute`` would call (statement, cursor, ``handle_error``, ``do_execute``).
Driver errors go through the connection's own error handling, so what is raised
(``hide_parameters``, ``connection_invalidated``) and what is invalidated (the connection
and its pool's older connections) are what ``Connection.execute`` would give.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection


def usable(conn: Connection) -> bool:
    if conn.dialect.driver != "psycopg" or conn.dialect.is_async or not conn.in_transaction():
        return False
    nested = conn.get_nested_transaction()
    if nested is not None and not nested.is_active:
        return False  # Connection.execute refuses to run in it; so must store()
    if conn.get_execution_options().get("schema_translate_map"):
        return False
    if conn.engine.logger.isEnabledFor(logging.INFO):
        return False  # the caller asked to see every statement
    events = conn.dispatch
    dialect_events = conn.dialect.dispatch
    return not (
        events.before_execute
        or events.after_execute
        or events.before_cursor_execute
        or events.after_cursor_execute
        or dialect_events.do_execute
        or dialect_events.handle_error
    )


def execute(conn: Connection, sql: str, parameters: dict[str, Any]) -> Sequence[Any]:
    dbapi_conn: Any = conn.connection.dbapi_connection
    dbapi_error: Any = conn.dialect.loaded_dbapi.Error
    # Prepared on first use (one statement per table), unless the caller turned psycopg's
    # prepared statements off (e.g. behind a transaction-mode pooler).
    prepare = None if dbapi_conn.prepare_threshold is None else True
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(sql, parameters, prepare=prepare)
        rows: Sequence[Any] = cursor.fetchall()
        return rows
    except dbapi_error as exc:
        # SQLAlchemy's own handler: the same wrapped error, parameters hidden when the
        # engine hides them, and on a disconnect the pool's older connections recycled too.
        conn._handle_dbapi_exception(exc, sql, parameters, cursor, None)
    finally:
        cursor.close()
