"""A package's public names imported on first use (PEP 562), not with the package.

Importing any module of a package runs the package's ``__init__`` first: with its public
names imported there, ``outbox worker --help`` loaded SQLAlchemy's ORM, every dialect and
psycopg before printing a line. ``export_lazily`` keeps ``from outbox import store`` and
``outbox.store(...)`` as they were, and loads ``outbox.store`` when that name is first used.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping


def export_lazily(package: str, exports: Mapping[str, str | None]) -> None:
    """Call at the end of ``package``'s ``__init__``: ``exports`` maps each public name to
    the module that defines it, or to None when the name is a module of the package.

    A name that is also the name of its own module (``outbox.store``, the function, in
    ``outbox/store.py``) stays the name: Python sets the package's attribute to the module
    whenever that module is first imported, from anywhere, and it is put back here."""
    module = sys.modules[package]
    module.__dict__["_lazy_exports"] = dict(exports)
    module.__class__ = _LazyPackage


class _LazyPackage(types.ModuleType):
    _lazy_exports: dict[str, str | None]

    def __getattr__(self, name: str) -> object:
        exports = self.__dict__.get("_lazy_exports", {})
        if name not in exports:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        source = exports[name]
        if source is None:
            return importlib.import_module(f"{self.__name__}.{name}")  # sets the attribute
        value = getattr(importlib.import_module(source), name)
        setattr(self, name, value)
        return value

    def __setattr__(self, name: str, value: object) -> None:
        if (
            isinstance(value, types.ModuleType)
            and value.__name__ == f"{self.__name__}.{name}"
            and self.__dict__.get("_lazy_exports", {}).get(name) == value.__name__
        ):
            value = getattr(value, name)
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted({*self.__dict__, *self.__dict__.get("_lazy_exports", {})})
