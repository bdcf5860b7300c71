"""The asyncio seam: async engines and connections, and the optional extra they need.

Everything async in this project runs the sync code (statements, validation, rules) on an
asyncio driver through SQLAlchemy's greenlet bridge (``AsyncConnection.run_sync``,
``greenlet_spawn``): only the execution differs, so no logic exists twice. This module is
the one place that knows the drivers and how to tell a user which extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from outbox.dialect import by_family
from outbox.dsn import normalize, prepare
from outbox.errors import MissingExtraError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

EXTRA = "outbox-relay[asyncio]"
# The module each async driver is imported as (what is missing when it is not installed).
_DRIVER_MODULES = {
    "postgresql+psycopg_async": "psycopg",
    "mysql+aiomysql": "aiomysql",
    "sqlite+aiosqlite": "aiosqlite",
}


def require(module: str = "greenlet") -> None:
    """Raise ``MissingExtraError`` naming the extra when ``module`` cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"asyncio support needs {module!r}, which is not installed: pip install '{EXTRA}'"
        ) from exc


def async_url(dsn: str | URL) -> URL:
    """``dsn`` with the asyncio driver of its database (``postgresql://`` -> psycopg's
    async form, ``mysql://``/``mariadb://`` -> aiomysql, ``sqlite://`` -> aiosqlite)."""
    url = normalize(dsn) if isinstance(dsn, str) else dsn
    family = "mysql" if url.get_backend_name() == "mariadb" else url.get_backend_name()
    return url.set(drivername=by_family(family).async_driver)


def require_driver(dsn: str | URL) -> None:
    """Raise ``MissingExtraError`` unless the asyncio driver of ``dsn`` can be loaded."""
    require("greenlet")
    require(_DRIVER_MODULES[async_url(dsn).drivername])


def make_async_engine(dsn: str | URL, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine for our own processes, prepared as ``dsn.make_engine`` prepares a
    sync one (SQLite's pragmas and ``BEGIN IMMEDIATE``, the idle-connection ping)."""
    url = async_url(dsn)
    require_driver(url)
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url, **kwargs)
    prepare(engine.sync_engine, pre_ping=bool(kwargs.get("pool_pre_ping")))
    return engine


async def connection_of(target: Any, argument: str = "conn_or_session") -> AsyncConnection:
    """The ``AsyncConnection`` of an ``AsyncSession`` (joining, or autobeginning, its
    transaction without a flush) or the ``AsyncConnection`` itself; a sync object or
    anything else is a ``TypeError`` that says which function takes it."""
    if isinstance(target, (Session, Connection)):
        raise TypeError(
            f"{argument}: got a sync {type(target).__name__}; use outbox.store() / "
            "store_many() with it, store_async() / store_many_async() take an AsyncSession "
            "or AsyncConnection"
        )
    require("greenlet")
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(target, AsyncSession):
        return await target.connection()
    if isinstance(target, AsyncConnection):
        return target
    raise TypeError(
        f"{argument}: expected a SQLAlchemy AsyncSession or AsyncConnection, got "
        f"{type(target).__name__}"
    )


def is_async_bind(target: Any) -> bool:
    """Whether ``target`` is an asyncio session or connection (without importing the
    asyncio extension when it was never loaded)."""
    module = type(target).__module__
    return module.startswith("sqlalchemy.ext.asyncio")
