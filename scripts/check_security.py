#!/usr/bin/env python3
"""Security lint: no pickle, no eval, no import of a name taken from message data.

AST-based, so comments, strings and docstrings never trip it and aliases do not hide a use.
Flags, in every ``.py`` file under the given paths (default: the product packages, scripts
and bench):

- SEC001 an import of ``pickle``, ``cPickle``, ``_pickle``, ``marshal``, ``shelve``, ``dill``,
  ``cloudpickle`` or ``jsonpickle`` (deserialising those runs code chosen by the data);
- SEC002 a call to the builtins ``eval``, ``exec`` or ``compile`` (also as ``builtins.eval``);
- SEC003 ``importlib.import_module(...)`` (however imported) or ``__import__(...)``.

A finding passes only if it is in ``ALLOWED``: (file, enclosing function, rule) with the
reason it is safe. Exit status: 0 clean, 1 findings, 2 usage or a file that does not parse.

    python scripts/check_security.py [PATH ...]
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATHS = ("outbox", "inbox", "relay", "scripts", "bench")

UNSAFE_MODULES = frozenset(
    {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
)
CODE_BUILTINS = frozenset({"eval", "exec", "compile"})

# (path relative to the repository root, enclosing function, rule) -> why it is safe.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("inbox/cli/__init__.py", "load_consumer", "SEC003"): (
        "`outbox worker MODULE:CONSUMER`: the module path is the operator's command-line "
        "argument, never message data; handlers are looked up by type in the Consumer registry"
    ),
    ("outbox/aio.py", "require", "SEC003"): (
        "checks that an optional dependency is installed: the module names are this package's "
        "own constants (greenlet, the asyncio drivers), never message data"
    ),
    ("outbox/exports.py", "_LazyPackage.__getattr__", "SEC003"): (
        "a package's public names imported on first use: the module names are the package's "
        "own constants, given to export_lazily in its __init__, never message data"
    ),
    ("outbox/cli_groups.py", "LazyGroup._load", "SEC003"): (
        "the `outbox` command's subcommands imported when used: the module names are constants "
        "of the command's own tables (outbox_cli/main.py, inbox/cli), never message data"
    ),
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int
    rule: str
    message: str
    function: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col + 1}: {self.rule} {self.message}"


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.findings: list[Finding] = []
        self._functions: list[str] = []
        # Local names bound to importlib.import_module / importlib / builtins.
        self._import_module_names: set[str] = set()
        self._importlib_names: set[str] = set()
        self._builtins_names: set[str] = set()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _add(self, node: ast.AST, rule: str, message: str) -> None:
        self.findings.append(
            Finding(
                self.path,
                getattr(node, "lineno", 0),
                getattr(node, "col_offset", 0),
                rule,
                message,
                ".".join(self._functions) or "<module>",
            )
        )

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._functions.append(node.name)
        self.generic_visit(node)
        self._functions.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_ClassDef = _function

    # -- imports -------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            bound = alias.asname or top
            if top in UNSAFE_MODULES:
                self._add(node, "SEC001", f"import of {alias.name!r} (unsafe deserialisation)")
            if alias.name == "importlib":
                self._importlib_names.add(bound)
            if alias.name == "builtins":
                self._builtins_names.add(bound)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] in UNSAFE_MODULES:
            self._add(node, "SEC001", f"import from {module!r} (unsafe deserialisation)")
        for alias in node.names:
            bound = alias.asname or alias.name
            if module == "importlib" and alias.name == "import_module":
                self._import_module_names.add(bound)
            if module == "builtins" and alias.name in CODE_BUILTINS:
                self._add(node, "SEC002", f"import of builtins.{alias.name}")
            if module == "builtins" and alias.name == "__import__":
                self._add(node, "SEC003", "import of builtins.__import__")
        self.generic_visit(node)

    # -- calls ---------------------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            if func.id in CODE_BUILTINS:
                self._add(node, "SEC002", f"call to {func.id}()")
            elif func.id == "__import__":
                self._add(node, "SEC003", "call to __import__()")
            elif func.id in self._import_module_names:
                self._add(node, "SEC003", "call to importlib.import_module()")
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner, attr = func.value.id, func.attr
            if owner in self._importlib_names and attr == "import_module":
                self._add(node, "SEC003", "call to importlib.import_module()")
            elif owner in self._builtins_names and attr in CODE_BUILTINS:
                self._add(node, "SEC002", f"call to builtins.{attr}()")
            elif owner in self._builtins_names and attr == "__import__":
                self._add(node, "SEC003", "call to builtins.__import__()")
        self.generic_visit(node)


def check_source(source: str, path: str) -> list[Finding]:
    """Every finding in ``source`` (allowed or not); raises SyntaxError if it does not parse."""
    visitor = _Visitor(path)
    visitor.visit(ast.parse(source, filename=path))
    return visitor.findings


def is_allowed(finding: Finding) -> bool:
    return (finding.path, finding.function, finding.rule) in ALLOWED


def python_files(paths: Sequence[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if ".venv" not in p.parts)
        elif path.suffix == ".py":
            yield path


def _relative(path: Path) -> str:
    resolved = path.resolve()
    if resolved.is_relative_to(ROOT):
        return resolved.relative_to(ROOT).as_posix()
    return path.as_posix()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    paths = [Path(a) for a in args] or [ROOT / p for p in DEFAULT_PATHS if (ROOT / p).exists()]
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"check_security: no such path: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    bad: list[Finding] = []
    checked = 0
    for file in python_files(paths):
        checked += 1
        try:
            findings = check_source(file.read_text(encoding="utf-8"), _relative(file))
        except SyntaxError as exc:
            print(f"{_relative(file)}: does not parse: {exc}", file=sys.stderr)
            return 2
        bad += [f for f in findings if not is_allowed(f)]
    for finding in bad:
        print(finding)
    print(f"check_security: {checked} files, {len(bad)} finding(s)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
