"""``store()``'s insert sent on the DBAPI cursor of the caller's connection.

``Connection.execute`` of a cached statement still builds an execution context, processes
parameters and wraps the result: on PostgreSQL that was a third of one ``store()``
(bench/store.py). The statement here is compiled once from the SQLAlchemy construct
(``outbox.queries.driver_statement``); values only ever travel as parameters.

Used only where it changes nothing the caller can see: psycopg 3 (sync), a transaction
already begun, no ``schema_translate_map`` and no cursor-execute event listener. Driver
errors come back as SQLAlchemy's ``DBAPIError`` subclasses, and a lost connection is
invalidated, as ``Connection.execute`` would do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError


def usable(conn: Connection) -> bool:
    if conn.dialect.driver != "psycopg" or conn.dialect.is_async or not conn.in_transaction():
        return False
    if conn.get_execution_options().get("schema_translate_map"):
        return False
    dispatch = conn.dispatch
    return not (dispatch.before_cursor_execute or dispatch.after_cursor_execute)


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
        if conn.dialect.is_disconnect(exc, dbapi_conn, cursor):
            conn.invalidate(exc)
        raise DBAPIError.instance(sql, parameters, exc, dbapi_error, dialect=conn.dialect) from exc
    finally:
        cursor.close()
