"""Seconds per test directory from a pytest JUnit report (``.ci/run`` writes build/junit.xml).

.venv/bin/python scripts/test_times.py build/junit.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main(path: str) -> None:
    per_dir: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    # our own CI report, not untrusted input
    for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314
        # classname: tests.faults.test_relay_kills -> tests/faults
        parts = (case.get("classname") or "?").split(".")
        key = "/".join(parts[:2] if parts[:1] == ["tests"] else parts[:1])
        per_dir[key] += float(case.get("time") or 0)
        count[key] += 1
    total = sum(per_dir.values())
    for key in sorted(per_dir, key=per_dir.__getitem__, reverse=True):
        print(f"{key:28} {count[key]:5d} tests {per_dir[key]:8.1f} s")
    print(f"{'total':28} {sum(count.values()):5d} tests {total:8.1f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/junit.xml")
