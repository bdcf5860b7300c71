"""The dashboard and the alert rules name only metrics the code exports, parse, and fire when
(and only when) they should. promtool is required: `make test` installs it
(scripts/ensure-promtool.sh); under CI=true a missing promtool fails these tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from outbox.metrics import DatabaseGauges, InboxGauge, Metrics, OutboxGauge, Snapshot
from outbox.ops import gauges as gauges_mod
from tests.support.services import binary

GRAFANA = Path(__file__).resolve().parents[3] / "grafana"
DASHBOARD = GRAFANA / "dashboard.json"
ALERTS = GRAFANA / "alerts.yml"
ALERT_TESTS = GRAFANA / "alerts_test.yml"
# Series Prometheus itself makes for every scrape target.
PROMETHEUS_SERIES = {"up"}
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not functions, labels or keywords)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", "", s)
    s = re.sub(r"\[[^\]]*\]", "", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[match.end() :].lstrip().startswith("("):
            continue  # a function or aggregation
        if match.group(0).lower() not in _KEYWORDS:
            names.add(match.group(0))
    return names


def test_metric_names_extractor() -> None:
    assert metric_names(
        "histogram_quantile(0.99, sum by (le, consumer) "
        '(rate(inbox_handler_seconds_bucket{consumer=~"$consumer|x"}[$__rate_interval])))'
    ) == {"inbox_handler_seconds_bucket"}
    assert metric_names('up{job="outbox-relay"} == 0 or absent(up{job="a b"})') == {"up"}
    assert metric_names("a / on (queue) group_left b > bool 3") == {"a", "b"}


def exported_sample_names() -> set[str]:
    """Every sample name a relay and a worker expose, read from the real exposition."""
    registry = CollectorRegistry()
    m = Metrics(registry)
    m.published("q", 1)
    m.publish_errors("q", 1)
    m.relay_batch(0.1)
    m.delivery_lag("q", 1, 0.1)
    m.processed("c", "q", 1, "done")
    m.duplicate("c", "q", 1)
    m.handler_time("c", "q", 1, 0.1)
    m.end_to_end("c", "q", 1, 0.1)
    snap = Snapshot((OutboxGauge("q", 1, 1, 1.0, 1),), (InboxGauge("c", 1, 1, 1, 1),))
    with patch.object(gauges_mod, "read_snapshot", lambda *_a, **_k: snap):
        registry.register(DatabaseGauges(None))  # type: ignore[arg-type]
        text = generate_latest(registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panel_exprs() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def alert_exprs() -> list[str]:
    text = ALERTS.read_text()
    exprs = re.findall(r"^\s*expr:\s*(.+)$", text, flags=re.MULTILINE)
    # One-line expressions only, so this reader sees each one whole.
    assert len(exprs) == len(re.findall(r"^\s*- alert:", text, flags=re.MULTILINE))
    return exprs


def test_dashboard_names_only_exported_metrics() -> None:
    exported = exported_sample_names() | PROMETHEUS_SERIES
    used: set[str] = set()
    for title, expr in panel_exprs():
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        assert names <= exported, f"{title}: {names - exported} not exported"
        used |= names
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            (name,) = re.findall(r"label_values\((\w+),", variable["definition"])
            assert name in exported
    # Every public metric (docs/architecture.md) appears somewhere on the dashboard.
    spec = {
        "outbox_pending_count", "outbox_pending_seconds", "outbox_failed_count",
        "outbox_published_total", "outbox_publish_errors_total", "inbox_processed_total",
        "inbox_duplicates_total", "inbox_waiting_count", "inbox_group_blocked_seconds",
        "outbox_delivery_lag_seconds_bucket", "inbox_end_to_end_seconds_bucket",
        "inbox_handler_seconds_bucket", "outbox_relay_batch_seconds_bucket",
        "inbox_review_count", "inbox_unknown_count",
    }  # fmt: skip
    assert spec <= used


def test_alerts_name_only_exported_metrics() -> None:
    exported = exported_sample_names() | PROMETHEUS_SERIES
    for expr in alert_exprs():
        names = metric_names(expr)
        assert names and names <= exported, f"{expr!r}: {names - exported}"


def test_dashboard_is_import_ready_with_a_datasource_variable() -> None:
    data = dashboard()
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert data["id"] is None and data["uid"]
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def promtool() -> str:
    return binary("promtool", "run scripts/ensure-promtool.sh (make test does)")


def run_promtool(*args: str, cwd: Path = GRAFANA) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules() -> None:
    out = run_promtool("check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 10 rules found" in out.stdout


def test_promtool_rule_unit_tests() -> None:
    out = run_promtool("test", "rules", str(ALERT_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    tests = ALERT_TESTS.read_text()
    alerts = re.findall(r"^\s*- alert:\s*(\w+)", ALERTS.read_text(), flags=re.MULTILINE)
    for alert in alerts:
        cases = re.findall(
            rf"alertname: {alert}\n\s*exp_alerts:(\s*\[\])?", tests, flags=re.MULTILINE
        )
        assert any(quiet for quiet in cases), f"{alert}: no case where it must stay quiet"
        assert any(not quiet for quiet in cases), f"{alert}: no case where it fires"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("(outbox_pending_seconds) > 30", "(outbox_pending_seconds) > 60"),
        ("(outbox_failed_count) > 0", "(outbox_failed_count) > 5"),
        ("[5m])) > 10000", "[5m])) > 20000"),
        ('absent(up{job="outbox-worker"})', 'absent(up{job="other"})'),
        ("(inbox_group_blocked_seconds) > 300", "(inbox_group_blocked_seconds) > 299"),
        # Summing what every relay/worker exports of one table counts each row once per process.
        ("max by (queue, priority) (delta(", "sum by (queue, priority) (delta("),
        (
            "max by (queue, priority) (outbox_failed_count)",
            "sum by (queue, priority) (outbox_failed_count)",
        ),
        (
            "max by (queue, priority) (outbox_pending_seconds)",
            "sum by (queue, priority) (outbox_pending_seconds)",
        ),
        ("max by (consumer) (inbox_failed_count)", "sum by (consumer) (inbox_failed_count)"),
        (
            "max by (consumer) (inbox_group_blocked_seconds)",
            "sum by (consumer) (inbox_group_blocked_seconds)",
        ),
        (
            "(inbox_unknown_count) > 0\n        for: 1m",
            "(inbox_unknown_count) > 0\n        for: 2m",
        ),
        ("(inbox_unknown_count) > 0", "(inbox_unknown_count) > 1"),
        ("max by (consumer) (inbox_unknown_count)", "sum by (consumer) (inbox_unknown_count)"),
        ("(inbox_review_count) > 0\n        for: 10m", "(inbox_review_count) > 0\n        for: 5m"),
        ("(inbox_review_count) > 0", "(inbox_review_count) > 2"),
        ("max by (consumer) (inbox_review_count)", "sum by (consumer) (inbox_review_count)"),
    ],
)
def test_rule_tests_catch_a_changed_rule(tmp_path: Path, old: str, new: str) -> None:
    # The rule tests must fail when a rule drifts: they are not tests that cannot fail.
    rules = ALERTS.read_text()
    assert old in rules
    (tmp_path / "alerts.yml").write_text(rules.replace(old, new))
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yml")
    out = run_promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert out.returncode != 0, out.stdout


def test_every_panel_expression_parses(tmp_path: Path) -> None:
    # promtool parses rule expressions: turn each panel query into a recording rule, with
    # Grafana's interval macros replaced by a duration. (JSON is YAML.)
    rules = [
        {"record": f"panel:{i}", "expr": re.sub(r"\$__(rate_)?interval", "5m", expr)}
        for i, (_title, expr) in enumerate(panel_exprs())
    ]
    path = tmp_path / "panels.yml"
    path.write_text(json.dumps({"groups": [{"name": "panels", "rules": rules}]}))
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout


# The gauges every relay (outbox) or every worker (inbox) reads from the one database.
DATABASE_DERIVED = (
    "outbox_pending_count", "outbox_pending_seconds", "outbox_failed_count",
    "inbox_waiting_count", "inbox_processing_count", "inbox_failed_count",
    "inbox_group_blocked_seconds", "inbox_review_count", "inbox_unknown_count",
)  # fmt: skip


def aggregations(expr: str, name: str) -> list[str]:
    """The aggregation operator around each use of ``name`` in ``expr`` ('' when bare), looking
    through the function calls between them (``max by (q) (delta(name[5m]))`` -> ``max``)."""
    found = []
    for use in re.finditer(rf"\b{name}\b", expr):
        before = expr[: use.start()]
        depth, i = 0, len(before) - 1
        operator = ""
        while i >= 0:
            if before[i] == ")":
                depth += 1
            elif before[i] == "(":
                if depth == 0:
                    head = re.search(r"(\w+)\s*(?:(?:by|without)\s*\([^()]*\)\s*)?$", before[:i])
                    word = head.group(1) if head else ""
                    if word in ("sum", "max", "min", "avg", "count", "topk", "bottomk"):
                        operator = word
                        break
                else:
                    depth -= 1
            i -= 1
        found.append(operator)
    return found


def test_aggregations_extractor() -> None:
    assert aggregations("max by (queue, priority) (delta(g[5m])) > 1", "g") == ["max"]
    assert aggregations('sum by (consumer) (g{consumer=~"$c"})', "g") == ["sum"]
    assert aggregations("g > 0", "g") == [""]


@pytest.mark.parametrize("name", DATABASE_DERIVED)
def test_database_gauges_are_combined_with_max_everywhere(name: str) -> None:
    # N relays (workers) export N copies of each of these series: only max counts a row once.
    exprs = [expr for _title, expr in panel_exprs()] + alert_exprs()
    uses = [(expr, op) for expr in exprs for op in aggregations(expr, name)]
    assert uses, f"{name}: used nowhere"
    for expr, op in uses:
        assert op == "max", f"{name} aggregated with {op or 'nothing'!r} in {expr!r}"


def test_per_process_counters_are_summed() -> None:
    # A counter counts what its own process did: the total over the processes is the sum.
    counters = ("outbox_published_total", "outbox_publish_errors_total", "inbox_processed_total")
    exprs = [expr for _title, expr in panel_exprs()] + alert_exprs()
    for name in counters:
        ops = [op for expr in exprs for op in aggregations(expr, name)]
        assert ops and set(ops) == {"sum"}, (name, ops)
