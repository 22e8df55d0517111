"""The Grafana dashboard and the Prometheus alert rules: well-formed, the Helm chart's
copy identical, every query naming metrics of the table (docs/metrics.md), and the
rules checked and unit-tested by promtool when it is installed.

That the named metrics are really exported is checked against live scrapes in
tests/integration/test_metrics_catalog.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shoal.core.metric_names import BY_NAME, promql_names

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/shoal.json"
HELM_COPY = ROOT / "deploy/helm/shoal/dashboards/shoal.json"
RULES = ROOT / "deploy/prometheus/rules.yaml"
RULES_TEST = ROOT / "deploy/prometheus/rules.test.yaml"


def dashboard_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    return out


def rule_exprs(rules: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def test_metric_names_of_expressions() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(shoal_read_seconds_bucket{source="x"}[5m])))'
        ' / clamp_min(shoal_tier_capacity_bytes, 1) + up{job="a"} and shoal_worker_up == 0'
    )
    assert promql_names(expr) == {
        "shoal_read_seconds",
        "shoal_tier_capacity_bytes",
        "up",
        "shoal_worker_up",
    }


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    assert dash["__inputs"][0]["name"] == "DS_PROMETHEUS"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] < 24 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}"
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("hit ratio", "throughput by source", "latency", "cached bytes per dataset",
                  "evictions", "errors and retries", "fallback", "job progress", "worker up",
                  "tiers not healthy"):  # fmt: skip
        assert topic in titles, topic


def test_helm_chart_ships_the_same_dashboard() -> None:
    assert HELM_COPY.read_bytes() == DASHBOARD.read_bytes()


def test_dashboard_queries_name_metrics_of_the_table() -> None:
    for title, expr in dashboard_exprs(json.loads(DASHBOARD.read_text())):
        unknown = promql_names(expr) - set(BY_NAME)
        assert not unknown, (title, unknown)


def test_alert_rules_name_metrics_of_the_table() -> None:
    rules = yaml.safe_load(RULES.read_text())
    names = {a for a, _ in rule_exprs(rules)}
    for want in ("ShoalWorkerDown", "ShoalCacheDiskUnstable", "ShoalHitRatioDropped",
                 "ShoalFallbackReadsRising", "ShoalPreloadWillMissDeadline"):  # fmt: skip
        assert want in names
    for alert, expr in rule_exprs(rules):
        unknown = promql_names(expr) - set(BY_NAME)
        assert not unknown, (alert, unknown)
    for g in rules["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in ("critical", "warning", "info")
            assert r["annotations"]["summary"]


def test_every_alert_has_a_promtool_scenario() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())
    tested = {
        t["alertname"]
        for case in tests["tests"]
        for t in case["alert_rule_test"]
        if t.get("exp_alerts")
    }
    assert tested == {a for a, _ in rule_exprs(yaml.safe_load(RULES.read_text()))}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    for args in (["check", "rules", RULES.name], ["test", "rules", RULES_TEST.name]):
        r = subprocess.run(
            ["promtool", *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stdout + r.stderr
