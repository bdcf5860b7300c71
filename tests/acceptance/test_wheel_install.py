"""The wheel as a user installs it: built from this checkout, installed into a fresh venv.

Runs ``outbox migrate`` (PostgreSQL, SQLite) and ``outbox demo`` from that venv in a working
directory outside the checkout, so only the installed wheel can be imported: a module or data
file the wheel forgets fails here, not on a user's machine. The dependencies come from the
package index pip is configured with (a warm cache makes that a few seconds), never from the
development venv, so an undeclared dependency fails here too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import inspect

from outbox.dsn import make_engine
from outbox.migrate import MIGRATIONS_DIR, head_revision
from tests.support.databases import DatabaseFactory

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"inbox", "outbox", "outbox_cli", "outbox_ui", "relay"}
# What a build must never see: a stale build/lib would put removed modules back in the wheel.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".*_cache",
    ".bench", "*.db", "*.db-*",
)  # fmt: skip
ORDER = re.compile(r"^\d+\. processing order: (?P<order>(?:[a-z]\d ?)+)", re.MULTILINE)


def _run(command: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH could put the checkout back on sys.path; nothing else of ours is inherited.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the checkout (pip builds in the source tree)."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    out = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), "."], source)
    (wheel,) = out.glob("outbox_relay-*.whl")
    return wheel


def _check_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (top_level,) = (n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert set(archive.read(top_level).decode().split()) == TOP_LEVEL
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == (
        TOP_LEVEL
    )
    shipped = {
        f"outbox/migrations/{p.relative_to(MIGRATIONS_DIR).as_posix()}"
        for p in MIGRATIONS_DIR.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert "outbox/migrations/script.py.mako" in shipped
    assert shipped <= names, shipped - names


def _install(wheel: Path, tmp_path: Path) -> Path:
    """A fresh venv holding the wheel and its declared dependencies; returns its bin/."""
    target = tmp_path / "venv"
    # No pip of its own (the slow part of a venv); the test's pip installs into it.
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel)],
        tmp_path,
    )
    return target / "bin"


@pytest.mark.slow
def test_the_wheel_installs_migrates_and_runs_the_demo(
    tmp_path: Path, db_factories: dict[str, DatabaseFactory]
) -> None:
    wheel = _build_wheel(tmp_path)
    _check_contents(wheel)
    bin_dir = _install(wheel, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    python, outbox = str(bin_dir / "python"), str(bin_dir / "outbox")
    head = head_revision()

    # Only the venv's copy is importable, and no top-level `migrations` comes with it.
    where = _run(
        [python, "-c", "import importlib.util as u, outbox.migrate as m; "
         "print(u.find_spec('migrations'), m.MIGRATIONS_DIR, m.head_revision())"],
        work,
    ).stdout.split()  # fmt: skip
    assert where[0] == "None"
    assert Path(where[1]).is_relative_to(bin_dir.parent), where
    assert where[2] == head

    postgresql = db_factories["postgresql"]
    with postgresql.database(empty=True) as url:
        dsn = url.render_as_string(hide_password=False)
        first = _run([outbox, "migrate", "--dsn", dsn], work).stdout
        assert f"schema migrated from nothing to revision {head}" in first
        again = _run([outbox, "migrate", "--dsn", dsn], work).stdout
        assert f"schema already at revision {head}" in again
        engine = make_engine(url)
        try:
            assert {"outbox", "inbox", "outbox_alembic_version"} <= set(
                inspect(engine).get_table_names()
            )
        finally:
            engine.dispose()

    # A relative SQLite path: the file lands in the working directory outside the checkout.
    sqlite = _run([outbox, "migrate", "--dsn", "sqlite:///migrated.db"], work).stdout
    assert f"schema migrated from nothing to revision {head}" in sqlite
    assert (work / "migrated.db").is_file()

    demo = _run([outbox, "demo", "--dsn", "sqlite:///demo.db"], work).stdout
    found = ORDER.search(demo)
    assert found, demo
    assert found["order"].split() == ["a1", "b1", "d1", "e1", "g1", "c2", "f2"]
    assert "two of the group at once: never" in demo
