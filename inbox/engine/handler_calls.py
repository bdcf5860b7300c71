"""How a consumer's handlers are called: ``def handler(session, message)`` directly,
``async def handler(session, message)`` on the runner thread's event loop.

One runner serves both kinds, with the same claim, lease, fencing, gate, batch and effect
transaction: with an async handler in the consumer, each runner thread runs its whole loop
inside ``greenlet_spawn`` on an event loop of its own, and the handler transaction's
``Session`` is the ``sync_session`` of an ``AsyncSession`` on an asyncio engine. The runner's
statements then go through the asyncio driver, an async handler gets the ``AsyncSession``
(the same transaction), a sync handler the ``Session`` as before. Claims, heartbeats and
ingest keep the sync engine: only the handler transaction needs the driver the handler
awaits.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from inbox.consumer import AsyncHandler, Consumer, Handler, InboxMessage, SyncHandler
from outbox import aio

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")
# Session.info key of the AsyncSession whose sync_session a handler transaction is.
_ASYNC_SESSION = "outbox.async_session"


def is_async(handler: Any) -> bool:
    """``async def`` functions, and objects whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - a method, not callability
    )


class HandlerCalls:
    """The handler transactions' sessions and the handler call, for one consumer.

    ``prepare`` turns an engine into the one handler transactions use (the runner's
    isolation level); it is applied to the asyncio engine's sync side too.
    """

    def __init__(
        self,
        consumer: Consumer,
        engine: Engine,
        prepare: Callable[[Engine], Engine] = lambda engine: engine,
    ) -> None:
        self.consumer = consumer
        self.engine = engine
        self.prepare = prepare
        self._sync = prepare(engine)
        self._local = threading.local()
        # handler -> is it async def: asked once per handler, not per message.
        self._kinds: dict[Handler, bool] = {}

    @property
    def asynchronous(self) -> bool:
        """Whether a handler is ``async def`` (read when a loop starts: handlers may be
        registered after the runner is made)."""
        return any(is_async(h) for h in self.consumer.handlers)

    def check(self) -> None:
        """Raise ``MissingExtraError`` (naming ``outbox-relay[asyncio]``) when an async
        handler's driver cannot be loaded: at start-up, not at the first message."""
        if self.asynchronous:
            aio.require_driver(self.engine.url)

    def run(self, body: Callable[[], T]) -> T:
        """Run ``body`` (a runner thread's loop) where ``call`` can await: with an async
        handler, inside a greenlet on an event loop of this thread, with an asyncio engine
        of this thread (asyncio connections belong to the loop that opened them)."""
        if not self.asynchronous:
            return body()
        return asyncio.run(self._on_loop(body))

    async def _on_loop(self, body: Callable[[], T]) -> T:
        from sqlalchemy.ext.asyncio import AsyncEngine
        from sqlalchemy.util import greenlet_spawn

        engine = aio.make_async_engine(self.engine.url)
        self._local.engine = AsyncEngine(self.prepare(engine.sync_engine))
        try:
            return await greenlet_spawn(body)
        finally:
            self._local.engine = None
            await engine.dispose()

    def session(self) -> Session:
        """A handler transaction's session: a plain ``Session``, or inside ``run`` with an
        async handler, the ``sync_session`` of an ``AsyncSession`` on this thread's
        asyncio engine."""
        engine: AsyncEngine | None = getattr(self._local, "engine", None)
        if engine is None:
            return Session(self._sync)
        from sqlalchemy.ext.asyncio import AsyncSession

        async_session = AsyncSession(engine)
        session = async_session.sync_session
        session.info[_ASYNC_SESSION] = async_session
        return session

    def call(self, handler: Handler, session: Session, message: InboxMessage) -> None:
        """Run ``handler`` in the transaction of ``session``."""
        asynchronous = self._kinds.get(handler)
        if asynchronous is None:
            asynchronous = self._kinds[handler] = is_async(handler)
        if asynchronous:
            async_session = session.info.get(_ASYNC_SESSION)
            if async_session is None:
                raise RuntimeError(
                    f"handler for {message.type!r} is async def: its runner must run "
                    "inside HandlerCalls.run()"
                )
            from sqlalchemy.util import await_only

            await_only(cast(AsyncHandler, handler)(async_session, message))
            return
        result: Any = cast(SyncHandler, handler)(session, message)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"handler for {message.type!r} returned an awaitable: declare it async def "
                "so that the worker awaits it"
            )
