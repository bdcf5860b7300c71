"""The README's "Testing your handlers with outbox.testing" example, run as it is printed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.support.workers import ROOT

SECTION = "## Testing your handlers with outbox.testing"


def example() -> str:
    """The first Python block of the section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index(SECTION) :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "the section has no python example"
    return match.group(1)


def test_the_readme_example_passes(tmp_path: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(example(), "README.md", "exec"), namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert tests, "the example defines no test"
    for test in tests:
        test(tmp_path)
