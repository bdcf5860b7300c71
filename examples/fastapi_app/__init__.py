"""An asyncio web app on outbox-relay: FastAPI stores an order and its ``order.created``
event in one transaction (``outbox.store_async``); an ``async def`` handler of the
``order-mailer`` consumer records the mail it sends in the inbox's own transaction.

``app.create_app(dsn)`` is the web side, ``consumers.consumer`` the worker side and
``tables`` the example's own tables. See README.md in this folder.
"""
