"""The CI skip hook: under CI=true a skip fails the run, unless the allow-list names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import ci_skips

ROOT = Path(__file__).resolve().parents[2]

SUITE = """
import pytest

def test_runs():
    assert True

def test_skips():
    pytest.skip("no broker here")

@pytest.mark.skip(reason="not today")
def test_marked():
    pass
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=SUITE)
    monkeypatch.setenv("CI", ci)
    return pytester.runpytest_inprocess("-p", "tests.support.ci_skips", "-p", "no:cacheprovider")


def test_a_skip_fails_under_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "true")
    # a skip in the call phase fails the test; a skip mark (setup phase) errors it
    result.assert_outcomes(passed=1, failed=1, errors=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skipped under CI=true*no broker here*"])


def test_a_skip_is_a_skip_locally(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, "")
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.OK


def test_a_module_level_skip_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_module_skip="import pytest\npytest.skip('whole module', allow_module_level=True)\n"
    )
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_inprocess("-p", "tests.support.ci_skips", "-p", "no:cacheprovider")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*skipped under CI=true*whole module*"])


def test_an_allowed_skip_passes_and_prints_its_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ci_skips.ALLOWED, "test_inner.py::test_skips", "the broker is optional")
    result = _run(pytester, monkeypatch, "true")
    result.assert_outcomes(passed=1, skipped=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*skips allowed under CI, with their reasons*",
            "test_inner.py::test_skips: *no broker here (allowed: the broker is optional)",
        ]
    )


def test_a_skip_fails_under_ci_in_parallel_workers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # make test runs the suite under pytest-xdist: the hook must act in the workers too
    pytester.makepyfile(test_inner=SUITE)
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # where tests.support.ci_skips imports from
    result = pytester.runpytest_subprocess(
        "-p", "tests.support.ci_skips", "-p", "no:cacheprovider", "-n", "2"
    )
    result.assert_outcomes(passed=1, failed=1, errors=1)
