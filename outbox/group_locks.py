"""The group lock's names and statements (the dialect seam, ``outbox.dialect``, takes and
releases it): a namespaced 64-bit advisory key on PostgreSQL, a hashed ``GET_LOCK`` name on
MariaDB/MySQL, and the statements that try many of them in one round trip.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Select, bindparam, func, literal, select

# Upper 32 bits of every PostgreSQL advisory key we take: "OBX1". Other advisory locks of
# the application use other namespaces and never collide with ours.
PG_LOCK_NAMESPACE = 0x4F425831
MYSQL_LOCK_PREFIX = "obx:"


# --- group lock keys --------------------------------------------------------------------------


def _digest(scope: str, group: str, size: int) -> bytes:
    # The NUL separator keeps ("a", "bc") and ("ab", "c") apart.
    return hashlib.blake2b(f"{scope}\0{group}".encode(), digest_size=size).digest()


def pg_lock_key(scope: str, group: str) -> int:
    """Signed 64-bit advisory key: namespace in the upper 32 bits, a hash of (scope, group)
    in the lower 32. A hash collision only serialises two groups, never breaks one."""
    low = int.from_bytes(_digest(scope, group, 4), "big")
    return (PG_LOCK_NAMESPACE << 32) | low


def mysql_lock_name(scope: str, group: str) -> str:
    """``GET_LOCK`` names are limited to 64 characters; groups may be 255: hash them (128
    bits, 36 characters in all)."""
    return MYSQL_LOCK_PREFIX + _digest(scope, group, 16).hex()


# --- group lock statements --------------------------------------------------------------------


def pg_lock_timeout(milliseconds: int) -> Select[Any]:
    """``SET LOCAL lock_timeout`` with a bound value (SET itself takes no parameters)."""
    return select(func.set_config("lock_timeout", f"{milliseconds}ms", literal(True)))


def pg_advisory_xact_lock(key: int) -> Select[Any]:
    return select(func.pg_advisory_xact_lock(key))


def pg_try_advisory_xact_lock(key: int) -> Select[Any]:
    return select(func.pg_try_advisory_xact_lock(key))


def mysql_get_lock(name: str, timeout_seconds: float) -> Select[Any]:
    """1 = obtained, 0 = timed out, NULL = error."""
    return select(func.get_lock(name, timeout_seconds))


def mysql_release_lock(name: str) -> Select[Any]:
    return select(func.release_lock(name))


def lock_parameters(values: Sequence[Any]) -> dict[str, Any]:
    """Parameters k0, k1, ... of the statements below."""
    return {f"k{i}": value for i, value in enumerate(values)}


def try_locks(
    conn: Connection,
    groups: Sequence[str],
    keys: Sequence[Any],
    locks: Callable[[int], Select[Any]],
) -> list[tuple[str, Any]]:
    """(group, key) of the groups whose lock ``locks`` got (true/1; busy 0, error NULL)."""
    obtained = conn.execute(locks(len(keys)), lock_parameters(keys)).one()
    return [(g, k) for g, k, ok in zip(groups, keys, obtained, strict=True) if ok]


@lru_cache(maxsize=1024)
def try_locks_pg(count: int) -> Select[Any]:
    """One row: ``pg_try_advisory_xact_lock`` per group key (``k0`` ...), in order; held
    until commit."""
    return select(*(func.pg_try_advisory_xact_lock(bindparam(f"k{i}")) for i in range(count)))


@lru_cache(maxsize=1024)
def get_locks_mysql(count: int) -> Select[Any]:
    """One row: ``GET_LOCK(name, 0)`` per group (``k0`` ...): 1 obtained, 0 busy, NULL
    error."""
    return select(*(func.get_lock(bindparam(f"k{i}"), 0) for i in range(count)))


@lru_cache(maxsize=1024)
def release_locks_mysql(count: int) -> Select[Any]:
    return select(*(func.release_lock(bindparam(f"k{i}")) for i in range(count)))
