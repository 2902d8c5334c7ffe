"""A target inside its own PID namespace (as in a container: `unshare --pid --fork --mount-proc`), watched by its
host pid: the syscalls and off-CPU probes, the GC uprobes and py-spy all work across the namespace, checked against
the process's own counts, not assumed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.config import Config, ProbesConfig, StacksConfig, TargetSpec
from agent.loop import CollectionLoop
from agent.state import AgentState
from agent.target_sources import build_collectors

# Waits for the go file, then makes exactly CALLS getppid calls and COLLECTIONS collections (automatic GC off), and
# spins in a function py-spy can name, then writes the pid it sees for itself (1: it is the namespace's init).
INSIDE = r"""
import gc, os, sys, time
gc.disable()
go, out = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.01)
for _ in range(4321):
    os.getppid()
for _ in range(17):
    gc.collect()

def spin_in_namespace(until):
    while time.monotonic() < until:
        sum(range(1000))

spin_in_namespace(time.monotonic() + 2.0)
open(out, "w").write(str(os.getpid()))
time.sleep(3600)
"""


def _host_pid_of_python(unshare_pid: int, timeout: float = 20) -> int:
    """unshare forks the namespace's init, which execs python: the python is unshare's child, as the host sees it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == unshare_pid and cmdline.startswith(sys.executable.encode()):
                return int(name)
        time.sleep(0.05)
    raise AssertionError("the python inside the namespace did not start")


@pytest.mark.bpf
def test_probes_gc_uprobes_and_pyspy_work_across_a_pid_namespace(require_bpf, tmp_path):
    go, out = tmp_path / "go", tmp_path / "pid"
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c", INSIDE,
                              str(go), str(out)])
    try:
        pid = _host_pid_of_python(outer.pid)
        assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid"), "a PID namespace of its own"
        spec = TargetSpec(name="contained", pid=pid)
        config = Config(interval_seconds=1.0, targets=(spec,), stacks=StacksConfig(rate_hz=97, steady_segment_seconds=1),
                        probes=ProbesConfig(tcp=False, runqueue=False, exits=False))
        windows = []
        loop = CollectionLoop(specs=[spec], collectors=build_collectors(config), state=AgentState(),
                              sink=windows.append, interval=1.0)
        try:
            loop.start()
            time.sleep(1.0)  # py-spy attached
            go.touch()
            deadline = time.monotonic() + 30
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert out.read_text() == "1", "inside its namespace the target is init (pid 1)"
            loop.tick()
            time.sleep(1.5)
            loop.tick()
        finally:
            loop.close()
    finally:
        outer.kill()
        outer.wait()
    assert all(w.pid == pid for w in windows), "windows name the host pid"
    assert sum(w.syscalls.counts.get("getppid", 0) for w in windows) == 4321
    assert sum(w.gc.collections for w in windows) == 17
    active = {stack: n for w in windows if w.stacks for stack, n in w.stacks.active.items()}
    assert any("spin_in_namespace" in stack for stack in active), list(active)[:5]
    assert all("gc" not in w.errors and "stacks" not in w.errors for w in windows), [w.errors for w in windows]
