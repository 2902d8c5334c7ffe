"""Every PromQL expression the fleet dashboards hold: the Grafana dashboard's and the Prometheus rules'."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
GRAFANA = DASHBOARDS / "grafana" / "infersight.json"
RULES = DASHBOARDS / "prometheus" / "rules.yml"

# What Grafana puts in place of its variables when a person picks "All" on a short range.
GRAFANA_VARIABLES = {"$instance": ".*", "$target": ".*", "$__rate_interval": "30s", "$__interval": "15s",
                     "$__range": "5m"}
_LABEL_VALUES = re.compile(r"label_values\((.+),\s*(\w+)\)")
# Alerts are written `<expression> <comparison> <number>` (rules.yml says so); `bool` makes them return
# their series whether or not they fire.
_ALERT = re.compile(r"^(?P<lhs>.+?)\s+(?P<op>==|!=|>=|<=|>|<)\s+(?P<num>-?[0-9.]+)$", re.S)


@dataclass(frozen=True)
class Expression:
    where: str
    promql: str


def grafana_expressions(path: Path = GRAFANA) -> list[Expression]:
    dash = json.loads(path.read_text())
    found = [Expression(f"panel {p['title']!r} {t['refId']}", t["expr"])
             for p in dash["panels"] for t in p.get("targets", [])]
    # An annotation query, like an alert, is empty while nothing happens: it is checked in its `bool` form.
    found += [Expression(f"annotation {a['name']!r}", with_bool(a["expr"], a["name"]))
              for a in dash["annotations"]["list"] if "expr" in a]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = _LABEL_VALUES.fullmatch(var["definition"])
            assert m, f"variable {var['name']}: only label_values(selector, label) is supported here"
            found.append(Expression(f"variable {var['name']!r}", m.group(1)))
    return [Expression(e.where, substitute(e.promql)) for e in found]


def substitute(promql: str) -> str:
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        promql = promql.replace(name, value)
    return promql


def rule_expressions(path: Path = RULES) -> list[Expression]:
    found = []
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            expr = " ".join(rule["expr"].split())
            if "alert" in rule:
                found.append(Expression(f"alert {rule['alert']}", with_bool(expr, rule["alert"])))
            else:
                found.append(Expression(f"record {rule['record']}", expr))
    return found


def with_bool(expr: str, name: str) -> str:
    m = _ALERT.fullmatch(" ".join(expr.split()))
    assert m, f"{name}: write it as '<expression> <comparison> <number>', got {expr!r}"
    return f"{m['lhs']} {m['op']} bool {m['num']}"
