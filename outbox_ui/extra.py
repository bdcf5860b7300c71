"""The ``outbox-relay[ui]`` extra: which modules the page needs, and the error naming it."""

from __future__ import annotations

import importlib

from outbox.errors import MissingExtraError

EXTRA = "outbox-relay[ui]"
# The import name of each distribution of the extra.
MODULES = ("starlette", "jinja2", "uvicorn", "python_multipart")


def require(modules: tuple[str, ...] = MODULES) -> None:
    """Raise ``MissingExtraError`` naming the extra when one of ``modules`` cannot be imported."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MissingExtraError(
                f"`outbox ui` needs {module!r}, which is not installed: pip install '{EXTRA}'"
            ) from exc
