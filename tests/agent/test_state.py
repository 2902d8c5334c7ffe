"""AgentState counts two things apart: failures of the agent's own work, and windows missing a reading."""

import ast
from pathlib import Path

from agent.state import AGENT_PARTS, AgentState
from analysis.window import GcReading, Window

REPO = Path(__file__).resolve().parents[2]


def test_a_missing_reading_is_counted_by_field_not_as_an_agent_error():
    state = AgentState(clock=lambda: 10.0)
    state.record_window(Window(target="t", pid=1, start=0.0, end=5.0, gc=GcReading(collections=1),
                               errors={"stacks": "failed: py-spy exited", "syscalls": "unsupported: slots full"}))
    snap = state.snapshot()
    # Stated by hand, not derived from READINGS / AGENT_PARTS: a reading or part dropped from either is caught.
    assert snap.missing_readings == {"syscalls": 1, "offcpu": 0, "gc": 0, "tcp": 0, "runqueue": 0, "process": 0,
                                     "stacks": 1, "latency": 0, "gpu": 0, "delivery": 0, "pressure": 0}
    assert snap.agent_errors == {"alerts": 0, "detector": 0, "discovery": 0, "identity": 0, "loop": 0, "otlp": 0,
                                 "retention": 0, "rollup": 0, "store": 0}
    state.count_error("store")
    assert state.snapshot().agent_errors["store"] == 1


def test_every_count_error_call_names_an_agent_part():
    names = []
    for path in sorted((REPO / "agent").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("count_error", "_on_error"):
                assert node.args and isinstance(node.args[0], ast.Constant), f"{path}:{node.lineno}"
                names.append(node.args[0].value)
    assert set(names) == set(AGENT_PARTS), sorted(set(names) ^ set(AGENT_PARTS))
