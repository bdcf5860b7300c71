"""scripts/check_security.py: it flags pickle/eval/exec/compile/dynamic imports, passes the
repository as it is (one allow-listed, operator-driven import), and fails on a bad file."""

from __future__ import annotations

import runpy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_security.py"
_ns: dict[str, Any] = runpy.run_path(str(SCRIPT))
check_source: Callable[[str, str], list[Any]] = _ns["check_source"]
is_allowed: Callable[[Any], bool] = _ns["is_allowed"]

BAD_FILE = '''\
import pickle
import marshal as m
from shelve import open as shelf_open
import importlib
import importlib as il
from importlib import import_module as load
import builtins


def handle(message):
    """eval(x) in a docstring is not a call"""
    cls = importlib.import_module(message["module"])
    other = il.import_module(message["other"])
    third = load(message["third"])
    fourth = __import__(message["fourth"])
    value = eval(message["expr"])
    exec(message["code"])
    code = compile(message["src"], "<msg>", "exec")
    builtins.eval(message["x"])
    return pickle.loads(message["blob"]), m, shelf_open, cls, other, third, fourth, value, code
'''

CLEAN_FILE = """\
import json
import re

PATTERN = re.compile(r"^[a-z]+$")  # re.compile is not the builtin


def handle(message):
    # eval, exec and pickle in comments and strings are harmless: "pickle.loads(eval(x))"
    return json.loads(message["body"]), PATTERN.match("ok"), {"eval": 1}.get("eval")
"""


def rules(source: str, path: str = "pkg/bad.py") -> list[tuple[int, str]]:
    return [(f.line, f.rule) for f in check_source(source, path)]


def test_flags_every_unsafe_construct_of_a_bad_file() -> None:
    found = rules(BAD_FILE)
    assert found == [
        (1, "SEC001"),  # import pickle
        (2, "SEC001"),  # import marshal as m
        (3, "SEC001"),  # from shelve import ...
        (12, "SEC003"),  # importlib.import_module
        (13, "SEC003"),  # alias il.import_module
        (14, "SEC003"),  # from importlib import import_module as load
        (15, "SEC003"),  # __import__
        (16, "SEC002"),  # eval
        (17, "SEC002"),  # exec
        (18, "SEC002"),  # compile
        (19, "SEC002"),  # builtins.eval
    ]


def test_comments_strings_and_re_compile_are_not_findings() -> None:
    assert rules(CLEAN_FILE) == []


def test_only_the_listed_function_is_allowed() -> None:
    source = "import importlib\n\ndef load_consumer(t):\n    return importlib.import_module(t)\n"
    [allowed] = check_source(source, "inbox/cli/__init__.py")
    assert is_allowed(allowed)
    # The same call elsewhere (other file, other function) is a finding
    [elsewhere] = check_source(source, "inbox/worker.py")
    assert not is_allowed(elsewhere)
    renamed = source.replace("load_consumer", "load_handler_from_message")
    [other_function] = check_source(renamed, "inbox/cli/__init__.py")
    assert not is_allowed(other_function)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_cli_fails_on_a_bad_file_and_names_the_lines(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(BAD_FILE)
    proc = _run(str(bad))
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 11
    assert any(
        line.endswith("SEC001 import of 'pickle' (unsafe deserialisation)") for line in lines
    )
    assert any(":16:" in line and "call to eval()" in line for line in lines)


def test_cli_passes_a_clean_file(tmp_path: Path) -> None:
    clean = tmp_path / "clean.py"
    clean.write_text(CLEAN_FILE)
    proc = _run(str(clean))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout == ""


@pytest.mark.parametrize("target", [[], ["outbox", "inbox", "relay"]])
def test_the_repository_is_clean(target: list[str]) -> None:
    proc = _run(*target)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 finding(s)" in proc.stderr


def test_unparsable_file_and_missing_path_are_usage_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    assert _run(str(broken)).returncode == 2
    assert _run(str(tmp_path / "nope")).returncode == 2
