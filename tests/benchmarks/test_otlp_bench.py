"""`bench overhead --otlp`: each source also runs with an [otlp] table pointing at a loopback sink that answers."""

from __future__ import annotations

import tomllib
import urllib.request
from pathlib import Path

from agent.config import config_from_dict
from benchmarks.harness import agent_config
from benchmarks.otlp_sink import OtlpSink
from benchmarks.overhead import conditions


def test_otlp_conditions_add_the_table_to_the_same_agent() -> None:
    conds = conditions(["all"], None, "http://127.0.0.1:4318")
    assert [c.label for c in conds] == ["all", "all + otlp"]
    plain, otlp = conds
    assert plain.extra == "" and otlp.source == "all"
    text = agent_config(otlp.source, Path("/tmp/store"), "127.0.0.1:1", 4242, "http://127.0.0.1:8000") + otlp.extra
    config = config_from_dict(tomllib.loads(text))
    assert config.otlp is not None and config.otlp.endpoint == "http://127.0.0.1:4318"
    assert conditions(["all"], None) == [plain]


def test_the_sink_answers_every_post() -> None:
    sink = OtlpSink()
    try:
        req = urllib.request.Request(f"{sink.endpoint}/v1/metrics", data=b"\x0a\x00", method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
        assert sink.requests == 1
    finally:
        sink.close()
