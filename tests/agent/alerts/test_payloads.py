"""Payload builders: fingerprint, times, Slack blocks, Alertmanager v2 bodies, and the body size bound."""

from __future__ import annotations

import json
from pathlib import Path

from agent.alerts import payloads
from agent.alerts.alerter import Alerter
from agent.alerts.config import AlertsConfig, ReceiverConfig
from agent.alerts.payloads import AlertEvent
from agent.store import Store
from analysis.regression import Cause


def event(make_reg, status: str = "firing", description: str | None = None) -> AlertEvent:
    reg = make_reg("p-1", opened_at=1_764_572_400.25, closed_at=1_764_572_460.0 if status == "resolved" else None)
    labels = payloads.alert_labels(reg, "gpu-7")
    ann = payloads.alert_annotations(reg, "http://gpu-7:9464", now=1_764_572_500.0)
    if description is not None:
        ann["description"] = description
    return AlertEvent(fingerprint=payloads.fingerprint(labels), status=status, labels=labels, annotations=ann,
                      starts_at=reg.opened_at, ends_at=reg.closed_at, generator_url="http://gpu-7:9464/",
                      causes=tuple(reg.causes), functions=tuple(reg.functions))


def test_fingerprint_and_times() -> None:
    # Alertmanager's fingerprint of the empty set is FNV-1a's offset basis; of {a="b"} a fixed value.
    assert payloads.fingerprint({}) == "cbf29ce484222325"
    assert payloads.fingerprint({"a": "b"}) == payloads.fingerprint({"a": "b"})
    assert payloads.fingerprint({"a": "b"}) != payloads.fingerprint({"a": "c"})
    assert payloads.rfc3339(1_764_572_400.0) == "2025-12-01T07:00:00Z"
    assert payloads.rfc3339(1_764_572_400.25) == "2025-12-01T07:00:00.25Z"


def test_slack_blocks(make_reg) -> None:
    doc = payloads.slack(event(make_reg, "resolved"))
    assert doc["text"].startswith("Resolved: latency regression on workload")
    kinds = [b["type"] for b in doc["blocks"]]
    assert kinds == ["header", "section", "section", "context"]
    fields = [f["text"] for f in doc["blocks"][1]["fields"]]
    assert fields[:2] == ["*Severity*\nwarning", "*Top cause*\ngc"]
    assert "1. gc (0.80)" in doc["blocks"][2]["text"]["text"]
    assert "differential flame graph" in doc["blocks"][3]["elements"][0]["text"]


def test_alertmanager_v2_ends(make_reg) -> None:
    (firing,) = payloads.alertmanager_v2([event(make_reg)], firing_ends_at=1_764_576_000.0)
    (resolved,) = payloads.alertmanager_v2([event(make_reg, "resolved")], firing_ends_at=0)
    assert firing["endsAt"] == "2025-12-01T08:00:00Z" and resolved["endsAt"] == "2025-12-01T07:01:00Z"
    assert set(firing) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}


def test_huge_evidence_is_cut_to_the_receivers_body_limit(tmp_path: Path, make_reg) -> None:
    receivers = tuple(ReceiverConfig(name=k, kind=k, url="http://127.0.0.1:1/", max_body_bytes=4096)
                      for k in ("webhook", "slack", "alertmanager"))
    with Store.open(tmp_path / "store") as store:
        alerter = Alerter(AlertsConfig(), receivers, store, host="h", external_url="http://x")
        big = event(make_reg, description="x" * 100_000)
        for r in receivers:
            body = alerter.body(r, [big], now=1.0)
            assert len(body) <= 4096, r.kind
            # Slack caps its own section at 3000 characters (Slack's limit), so it fits without the cut.
            assert ("(truncated)" in body.decode()) == (r.kind != "slack")
            json.loads(body)


def test_description_ranks_causes_and_functions(make_reg) -> None:
    reg = make_reg("d")
    reg.causes.append(Cause("network", 0.05, "retransmits 3/s vs 0/s"))
    text = payloads.alert_annotations(reg, "http://x", now=0)["description"].splitlines()
    assert [line.split(" ")[1] for line in text[:3]] == ["gc", "cpu_contention", "network"]
    assert text[3] == "functions that grew: gc_heavy (workload/model.py:42) 1%->30%"


def test_a_family_regression_names_the_process_of_its_top_cause_in_the_summary(make_reg) -> None:
    reg = make_reg("f")
    plain = payloads.alert_annotations(reg, "http://x", now=0)["summary"]
    assert "top cause gc, score" in plain  # a single-process target: no process named
    top = reg.causes[0]
    reg.causes[0] = Cause(top.label, top.score, top.evidence + "; in pid 4243 (VLLM::EngineCore): 210 ms/s", pid=4243,
                          process="VLLM::EngineCore")
    summary = payloads.alert_annotations(reg, "http://x", now=0)["summary"]
    assert "top cause gc in pid 4243 (VLLM::EngineCore), score" in summary
    assert payloads.alert_labels(reg, "h") == payloads.alert_labels(make_reg("f"), "h")  # labels keep the alert's identity


def test_a_cpu_contention_alert_names_the_neighbour_that_held_the_cpu(make_reg) -> None:
    from analysis.regression import Neighbour

    reg = make_reg("n")
    hog = Neighbour(pid=9911, comm="python3", seconds=14.2, share=0.71, cmdline="python3 hog.py\x1b[2J", user="bob")
    reg.causes[0] = Cause("cpu_contention", 1.0, "run-queue wait per CPU second 2.1 vs 0.3", neighbours=(hog,))
    summary = payloads.alert_annotations(reg, "http://x", now=0)["summary"]
    assert "top cause cpu_contention beside pid 9911 (`python3 hog.py" in summary
    assert "user bob, 71 % of the run-queue wait)" in summary and "\x1b" not in summary  # the hog's own text, escaped


def test_a_memory_alert_names_the_process_that_grew(make_reg) -> None:
    from analysis.regression import Grower

    reg = make_reg("m")
    alloc = Grower(pid=9911, comm="python3", grew_bytes=3 << 30, seconds=60.0, cmdline="python3 alloc.py\x1b[2J",
                   user="bob")
    reg.causes[0] = Cause("memory", 1.0, "memory stall of the server's cgroup x9", growers=(alloc,))
    summary = payloads.alert_annotations(reg, "http://x", now=0)["summary"]
    assert "top cause memory after pid 9911 (`python3 alloc.py" in summary
    assert "user bob) grew by 3072 MiB" in summary and "\x1b" not in summary
    own = Grower(pid=4242, comm="srv", grew_bytes=1 << 30, seconds=60.0, member=True)
    reg.causes[0] = Cause("memory", 1.0, "memory stall x9", growers=(own,))
    assert "after the server's own pid 4242 (`srv`) grew by 1024 MiB" in \
        payloads.alert_annotations(reg, "http://x", now=0)["summary"]
