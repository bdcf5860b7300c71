"""Which producer takes which object: sync objects go to ``store()``, asyncio ones to
``store_async()``, and each says so when handed the other kind; the keyword arguments of the
asyncio producers are exactly those of the sync ones."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox import aio
from outbox.errors import MissingExtraError


@pytest.fixture
def sync_connection() -> Iterator[Connection]:
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        yield conn
    engine.dispose()


@pytest.fixture
def async_connection() -> Iterator[AsyncConnection]:
    engine = create_async_engine("sqlite+aiosqlite://")
    # Not started: the object's type is all store() looks at.
    yield engine.connect()
    asyncio.run(engine.dispose())


def _store_async(target: Any) -> None:
    asyncio.run(outbox.store_async(target, "q", "t", {}))


def _store_many_async(target: Any) -> None:
    asyncio.run(outbox.store_many_async(target, [outbox.Message("q", "t", {})]))


ASYNC_PRODUCERS: list[Callable[[Any], None]] = [_store_async, _store_many_async]


@pytest.mark.parametrize("produce", ASYNC_PRODUCERS, ids=["store_async", "store_many_async"])
def test_a_sync_session_or_connection_is_sent_to_store(
    produce: Callable[[Any], None], sync_connection: Connection
) -> None:
    for target in (Session(), sync_connection):
        with pytest.raises(TypeError, match=r"conn_or_session: got a sync .*outbox\.store\(\)"):
            produce(target)


@pytest.mark.parametrize("produce", ASYNC_PRODUCERS, ids=["store_async", "store_many_async"])
def test_garbage_is_refused_by_the_async_producers(produce: Callable[[Any], None]) -> None:
    for target in ("not a connection", None, object()):
        with pytest.raises(TypeError, match="conn_or_session: expected a SQLAlchemy Async"):
            produce(target)


def test_an_asyncio_session_or_connection_is_sent_to_store_async(
    async_connection: AsyncConnection,
) -> None:
    for target in (AsyncSession(), async_connection):
        with pytest.raises(TypeError, match=r"conn_or_session: got an asyncio .*store_async\(\)"):
            outbox.store(target, "q", "t", {})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"store_many_async\(\)"):
            outbox.store_many(target, [])  # type: ignore[arg-type]


def test_a_missing_module_names_the_extra_to_install() -> None:
    with pytest.raises(MissingExtraError) as raised:
        aio.require("no_such_module_xyz")
    assert "no_such_module_xyz" in str(raised.value)
    assert "pip install 'outbox-relay[asyncio]'" in str(raised.value)


@pytest.mark.parametrize(
    ("sync", "asynchronous"),
    [(outbox.store, outbox.store_async), (outbox.store_many, outbox.store_many_async)],
    ids=["store", "store_many"],
)
def test_the_async_producers_take_the_same_arguments(
    sync: Callable[..., Any], asynchronous: Callable[..., Any]
) -> None:
    def rest(fn: Callable[..., Any]) -> list[tuple[str, Any, Any, Any]]:
        # Everything after the session/connection argument, whose type differs by design.
        params = list(inspect.signature(fn).parameters.values())[1:]
        return [(p.name, p.kind, p.default, p.annotation) for p in params]

    assert rest(asynchronous) == rest(sync)
    assert inspect.signature(asynchronous).return_annotation == (
        inspect.signature(sync).return_annotation
    )
