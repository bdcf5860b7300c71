"""``outbox ui``: the operator page. Server-rendered pages over the operator cores of
``outbox.ops`` and ``inbox.ops``: every read and every action is a call the CLI makes too.

The web stack (Starlette, Jinja2, uvicorn) is the ``outbox-relay[ui]`` extra; only
``outbox_ui.command`` is imported without it (the ``outbox`` command registers it).
"""
