"""Under ``CI=true`` a skipped test is a failed test, unless the allow-list names it.

A green CI run must mean every test ran its assertions. Locally a skip stays a skip (a
developer without RabbitMQ still gets the rest of the suite); in CI the skip's report is
turned into a failure that says why. The allow-list holds the few skips a user would accept
(none today); the reasons of the allowed skips that happened are printed at the end of the
run, so that an allowed skip is never silent.

Registered from ``tests/conftest.py``; ``tests/unit/test_ci_skips.py`` runs a small suite
through it with pytester.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

# node id prefix -> why skipping it under CI is acceptable
ALLOWED: dict[str, str] = {}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def allowed_reason(nodeid: str) -> str | None:
    for prefix, reason in ALLOWED.items():
        if nodeid == prefix or nodeid.startswith(prefix + "[") or nodeid.startswith(prefix + "::"):
            return reason
    return None


def _skip_message(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_instead(report: pytest.TestReport | pytest.CollectReport) -> None:
    message = _skip_message(report)
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI=true: {message}\n"
        "A skip in CI is a failure (tests/support/ci_skips.py); make the test run, or put it on"
        " the allow-list there with a reason a user would accept."
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (in_ci() and report.skipped):
        return
    if allowed_reason(item.nodeid) is not None:
        return
    _fail_instead(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, None]:
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if in_ci() and report.skipped and allowed_reason(report.nodeid) is None:
        _fail_instead(report)


class _AllowedSkips:
    """Collects, on the process that prints the summary, the allowed skips that happened."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and in_ci():
            reason = allowed_reason(report.nodeid)
            if reason is not None:
                self.seen.append((report.nodeid, reason, _skip_message(report)))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seen:
            return
        terminalreporter.section("skips allowed under CI, with their reasons")
        for nodeid, reason, message in self.seen:
            terminalreporter.line(f"{nodeid}: {message} (allowed: {reason})")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_AllowedSkips(), "ci-allowed-skips")
