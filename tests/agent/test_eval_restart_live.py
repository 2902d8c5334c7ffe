"""`restart` live: the scenario's server restarted mid-run with other arguments and environment, on the same port,
watched as one target by that port; the change the agent records rides in the recording; every process ends."""

from __future__ import annotations

import gzip
import io
import re
from pathlib import Path

import pytest

from agent.evaluation.live import run_live
from agent.evaluation.recording import read_recording
from analysis.scenario import parse_scenario
from tests.agent.eval_detector import ThresholdDetector
from tests.agent.test_eval_live import alive

pytestmark = [pytest.mark.slow, pytest.mark.workload, pytest.mark.bpf]

SCENARIO = '''
name = "live restart"
interval_seconds = 2
[load]
rate = 2.0
max_tokens = "8-16"
[[phase]]
seconds = 10
label = "normal"
[[phase]]
seconds = 40
label = "change"
restart = { args = ["--max-batch", "2"], env = { OMP_NUM_THREADS = "1", NOT_ALLOWLISTED = "s3cr3t-value" } }
'''


def test_a_restart_phase_keeps_one_target_on_one_port_and_records_the_change(tmp_path: Path, require_root) -> None:
    scenario = parse_scenario(SCENARIO)
    progress = io.StringIO()
    run = run_live(scenario, 2.0, lambda: ThresholdDetector(warmup=2), tmp_path / "rec.jsonl.gz", progress=progress)
    log = progress.getvalue()
    assert run.complete, log
    rec = read_recording(run.recorded)
    pids = list(dict.fromkeys(w.window.pid for w in rec.windows))
    # One target throughout: the first server's windows, then the restarted one's (a loaded host may cut one more
    # window of the old process as it ends).
    assert len(pids) == 2 and {w.window.target for w in rec.windows} == {"workload"}, (pids, log)
    first, second = pids
    assert [w.window.pid for w in rec.windows if w.phase == 0] and all(
        w.window.pid == first for w in rec.windows if w.phase == 0)
    after = [w for w in rec.windows if w.window.pid == second]
    assert any(w.window.latency is not None and w.window.latency.requests > 0 for w in after), log
    changes = [w.change for w in rec.windows if w.change is not None]
    assert len(changes) == 1, log
    (change,) = changes
    assert change["pid"] == second and change["target"] == "workload"
    parts = {d["part"]: d for d in change["diff"]}
    assert [d["part"] for d in change["diff"]][:2] == ["cmdline", "env"]
    port = re.search(r"--port (\d+)", parts["cmdline"]["before"]).group(1)
    assert parts["cmdline"]["after"].endswith(f"--port {port} --max-batch 2")
    assert parts["cmdline"]["before"].endswith(f"--port {port}")
    assert "OMP_NUM_THREADS=1" in parts["env"]["after"]
    # The allowlist holds in the recording as in the store: the other variable's value is never read.
    assert b"s3cr3t-value" not in gzip.decompress(run.recorded.read_bytes()) and "s3cr3t-value" not in str(rec.windows)
    assert f"restarted server pid {second} serves" in log and f"pid {first} ended, restarting" in log
    for pid in (first, second):
        assert not alive(pid), (pid, log)
