"""promtool on the fleet files: rules and their unit tests, the scrape example, and /metrics of the agent and the workload."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.detection import DetectionSnapshot, TargetFinding
from agent.detection_metrics import DetectionCollector
from agent.metrics import build_registry
from tests.dashboards.promql import DASHBOARDS, GRAFANA, grafana_expressions, rule_expressions
from workload.metrics import create_metrics

PROMETHEUS = DASHBOARDS / "prometheus"


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: 'make setup' installs the Debian prometheus package")
    return subprocess.run([path, *args], input=stdin, capture_output=True, text=True, timeout=120,
                          cwd=PROMETHEUS)


def test_rules_check_and_their_unit_tests_pass():
    check = promtool("check", "rules", "rules.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    unit = promtool("test", "rules", "rules_test.yml")
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr


def test_scrape_example_is_a_valid_config():
    check = promtool("check", "config", "scrape.example.yml")
    assert check.returncode == 0, check.stdout + check.stderr


def test_agent_metrics_pass_promtool_check_metrics(state):
    registry = build_registry(state)
    snap = DetectionSnapshot(findings={"server": TargetFinding("server", "healthy", 1.2, {"p50": 0.04, "p99": 0.1},
                                                               None, 1005.0)}, opened={("server", "gc"): 1})
    registry.register(DetectionCollector(lambda: snap))
    text = generate_latest(registry).decode()
    assert 'infersight_request_latency_seconds{percentile="p99",target="server"} 0.12' in text
    check = promtool("check", "metrics", stdin=text)
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr


def test_workload_own_names_pass_promtool_check_metrics():
    registry = CollectorRegistry()
    m = create_metrics(registry, "tiny")
    m.fault_active.labels("slow_decode").set(1)
    m.rejected.labels("tiny", "queue_full").inc()
    text = generate_latest(registry).decode()
    assert "workload_batch_size_bucket" in text and "workload_fault_active" in text
    check = promtool("check", "metrics", stdin=text)
    # vLLM's `vllm:` names are copied on purpose (a vLLM scrape config reads the workload unchanged).
    problems = [line for line in (check.stdout + check.stderr).splitlines() if not line.startswith("vllm:")]
    assert problems == []


def test_grafana_dashboard_has_variables_annotations_and_only_known_series():
    dash = json.loads(GRAFANA.read_text())
    assert {v["name"] for v in dash["templating"]["list"]} >= {"target", "instance"}
    assert any("infersight_regression_active" in a.get("expr", "") for a in dash["annotations"]["list"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    exprs = grafana_expressions()
    assert len(exprs) >= 30 and all("$" not in e.promql for e in exprs), [e for e in exprs if "$" in e.promql]
    rules = rule_expressions()
    assert {e.where for e in rules} >= {"alert InfersightRegressionOpen", "alert InfersightTargetDown",
                                        "alert InfersightProbeFailing",
                                        "alert InfersightAgentDown", "alert InfersightAgentLate",
                                        "alert InfersightAgentDroppingWindows"}
    # Each expression parses: promtool's rule checker is Prometheus's own PromQL parser.
    for e in exprs:
        check = promtool("check", "rules", "/dev/stdin",
                         stdin=json.dumps({"groups": [{"name": "g", "rules": [{"record": "x:y:z", "expr": e.promql}]}]}))
        assert check.returncode == 0, (e.where, check.stdout + check.stderr)


def test_grafana_dashboard_charts_every_exported_family(state):
    registry = build_registry(state)
    snap = DetectionSnapshot(findings={"server": TargetFinding("server", "healthy", 1.0, {"p99": 0.1}, None, 1.0)},
                             opened={("server", "gc"): 1})
    registry.register(DetectionCollector(lambda: snap))
    families = {m.name for m in registry.collect()}
    text = " ".join(e.promql for e in grafana_expressions())
    # prometheus_client names counters without `_total`; the exposition (and PromQL) has it.
    missing = sorted(f for f in families if f not in text)
    assert missing == [], missing
