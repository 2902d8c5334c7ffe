"""`infersight eval` live: a real server, load, a fault, an outside command; labels, cleanup on every exit."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.evaluation.live import run_live
from agent.evaluation.processes import EvalProcessError
from agent.evaluation.recording import read_recording
from analysis.scenario import load_scenario
from tests.agent.eval_detector import ThresholdDetector
from tests.agent.test_shutdown import default_sigint

pytestmark = [pytest.mark.slow, pytest.mark.workload, pytest.mark.bpf]
REPO = Path(__file__).resolve().parents[2]

# Writes its pid and a grandchild's pid, then waits: both must be gone once the phase ends.
LINGER = '''
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(600)
'''


def scenario_file(tmp: Path, linger_seconds: int = 8) -> Path:
    (tmp / "linger.py").write_text(LINGER)
    path = tmp / "s.toml"
    path.write_text(f'''
name = "live smoke"
interval_seconds = 2
[load]
rate = 3.0
max_tokens = "8-16"
[[phase]]
seconds = 8
label = "normal"
[[phase]]
seconds = 6
fault = "gc"
label = "gc"
[[phase]]
seconds = {linger_seconds}
rate = 1.0
run = ["{sys.executable}", "{{scenario_dir}}/linger.py", "{{scenario_dir}}/pids"]
culprit = true
label = "blocked"
''')
    return path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose: it runs nothing.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_live_run_labels_its_windows_and_ends_everything(tmp_path: Path, require_root) -> None:
    scenario = load_scenario(scenario_file(tmp_path))
    progress = io.StringIO()
    run = run_live(scenario, 2.0, lambda: ThresholdDetector(warmup=2), tmp_path / "rec.jsonl.gz", progress=progress)
    log = progress.getvalue()
    assert run.complete and run.recorded == tmp_path / "rec.jsonl.gz", log
    labels = [w.label for w in run.windows]
    # 22 s in 2 s windows; a busy host makes ticks late (longer windows, fewer of them), never gaps.
    assert 6 <= len(labels) <= 12, labels
    spans = [(a.window.end, b.window.start) for a, b in zip(run.windows, run.windows[1:])]
    assert all(abs(end - start) < 1e-6 for end, start in spans)
    assert sum(w.window.duration for w in run.windows) == pytest.approx(22, abs=2.5)
    order = [label for i, label in enumerate(labels) if i == 0 or labels[i - 1] != label]
    assert order == ["normal", "gc", "blocked"], labels
    for item in run.windows:
        mid = (item.window.start + item.window.end) / 2 - run.windows[0].window.start
        assert item.phase == scenario.phase_at(mid), (item.phase, mid)
    # Each window carries what the agent collects: BPF, py-spy, psutil and latency, with the server's figures.
    w = run.windows[2].window
    assert w.syscalls is not None and w.offcpu is not None and w.process is not None
    # py-spy segments last one window but start late and end a little after the tick on a busy host, so a
    # window may find none finished (its stacks then come with the next one); such a window says why.
    later = [x.window for x in run.windows[1:]]
    with_stacks = [x for x in later if x.stacks is not None]
    assert len(with_stacks) >= len(later) // 2, [x.errors.get("stacks") for x in later]
    assert all(x.errors.get("stacks") for x in later if x.stacks is None), [x.errors for x in later]
    assert w.latency is not None and w.latency.requests > 0 and w.latency.tokens_per_second > 0, w.errors
    gc_windows = [x.window for x in run.windows if x.label == "gc" and x.window.gc is not None]
    normal = [x.window for x in run.windows[:3] if x.window.gc is not None]
    if gc_windows and normal:  # the gc probe needs the interpreter's USDT or symbols; where it runs, it moved
        assert max(g.gc.collections for g in gc_windows) > 5 * max(1, max(n.gc.collections for n in normal))
    assert len(run.outcomes) == len(run.windows) and run.outcomes[0].warmup and not run.outcomes[-1].warmup
    recorded = read_recording(run.recorded).windows
    assert len(recorded) == len(run.windows)
    # Beside each window, what the load's clients measured over it (3 req/s: a few requests per 2 s window).
    assert all(w.clients is not None for w in recorded)
    assert sum(w.clients.requests for w in recorded) >= 3 * 22 * 0.5
    timed = [w.clients for w in recorded if w.clients.p99_seconds is not None]
    assert len(timed) >= len(recorded) // 2 and all(0 < c.p50_seconds <= c.p99_seconds < 60 for c in timed)
    server_pid = int(re.search(r"server pid (\d+)", log).group(1))
    command_pid, grandchild = map(int, (tmp_path / "pids").read_text().split())
    for pid in (server_pid, command_pid, grandchild):
        assert not alive(pid), (pid, log)
    assert "phase 2/3 (6s): label gc, rate 3/s, fault gc" in log
    # The `culprit = true` phase's command pid rides beside its windows, in the recording and in the outcomes.
    assert {w.culprit for w in recorded if w.phase == 2} == {command_pid}
    assert {w.culprit for w in recorded if w.phase != 2} == {None}
    assert {o.culprit for o in run.outcomes if o.label == "blocked"} == {command_pid}


def test_ctrl_c_ends_the_server_and_the_phase_command(tmp_path: Path, require_root) -> None:
    path = scenario_file(tmp_path, linger_seconds=60)
    record = tmp_path / "cut.jsonl.gz"
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "eval", str(path), "--record-only", "--record",
                             str(record)], cwd=REPO, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    seen = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen.append(line)
            if "phase 3/3" in line or not line:
                break
        assert "phase 3/3" in seen[-1], "".join(seen)
        time.sleep(2)  # the command has written its pids
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest
    assert "interrupted; every process it started was ended" in rest and "Traceback" not in rest
    server_pid = int(re.search(r"server pid (\d+)", "".join(seen)).group(1))
    command_pid, grandchild = map(int, (tmp_path / "pids").read_text().split())
    for pid in (server_pid, command_pid, grandchild):
        assert not alive(pid), pid
    assert not record.exists() and record.with_name(record.name + ".part").exists()


def test_a_phase_command_that_fails_stops_the_run_with_its_words_and_one_that_succeeds_early_does_not(
        tmp_path: Path, require_root) -> None:
    # A fault command that fails (an nftables rule that does not parse) leaves its phase as normal traffic under
    # a fault's label: scored as if it had run, with no word of it, unless the run stops and says so.
    ok = [sys.executable, "-c", "print('stopped it once')"]
    bad = [sys.executable, "-c", "import sys; print('nft: Error: Value 100 exceeds valid range 0-99'); sys.exit(3)"]
    path = tmp_path / "s.toml"
    path.write_text(f'''
name = "failing command"
interval_seconds = 2
[load]
rate = 2.0
[[phase]]
seconds = 4
label = "normal"
[[phase]]
seconds = 4
run = {json.dumps(ok)}
label = "blocked"
[[phase]]
seconds = 6
run = {json.dumps(bad)}
label = "network"
''')
    progress = io.StringIO()
    with pytest.raises(EvalProcessError) as raised:
        run_live(load_scenario(path), 2.0, None, tmp_path / "rec.jsonl.gz", progress=progress)
    log = progress.getvalue()
    message = str(raised.value)
    assert "phase 3's command" in message and "(status 3)" in message, message
    assert "Value 100 exceeds valid range 0-99" in message and "did not run as written" in message, message
    assert re.search(r"phase 2's command finished after \d+\.\ds \(status 0\)", log), log
    assert "logs are kept in" in log
    assert not (tmp_path / "rec.jsonl.gz").exists() and (tmp_path / "rec.jsonl.gz.part").exists()
    server_pid = int(re.search(r"server pid (\d+)", log).group(1))
    assert not alive(server_pid)
