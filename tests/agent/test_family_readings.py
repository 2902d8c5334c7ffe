"""A family target's readings against ground truth: a parent and three children, each making a known number of
getppid calls, GC collections and sleeps, and a fourth child that lives 200 ms between two windows, measured by the
real probes through the collection loop. Every count is exact per member and in total; the family's reading fields
are the members' sums (analysis.family), the short-lived child's GC collections included: the gc probe follows the
family's forks through its image's system-wide uprobes (docs/window.md)."""

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
from agent.targets import Member, Target, read_proc

# Per process: (getppid calls, gc.collect() calls, sleeps of 50 ms). Automatic collection is off, so gc.collect()
# is every collection the process runs; the parent is index 0.
WORK = [(1000, 3, 2), (2000, 5, 4), (3000, 7, 6), (4000, 9, 8)]

FAMILY = r"""
import gc, os, sys, time
gc.disable()
work = WORK
go, out = sys.argv[1], sys.argv[2]

def serve(index):
    calls, collections, sleeps = work[index]
    while not os.path.exists(go):
        time.sleep(0.01)
    for _ in range(calls):
        os.getppid()
    for _ in range(collections):
        gc.collect()
    for _ in range(sleeps):
        time.sleep(0.05)
    if index == 0:
        # A child that lives 200 ms and ends between two windows: found by the kernel at its fork, not by discovery.
        child = os.fork()
        if child == 0:
            for _ in range(SHORT):
                os.getppid()
            for _ in range(SHORT_GC):
                gc.collect()
            time.sleep(0.2)
            os._exit(0)
        os.waitpid(child, 0)
        open(f"{out}.short", "w").write(str(child))
    open(f"{out}.{index}", "w").close()
    while True:
        time.sleep(3600)

for index in (1, 2, 3):
    if os.fork() == 0:
        serve(index)
serve(0)
""".replace("WORK", repr(WORK)).replace("SHORT_GC", "11").replace("SHORT", "777")


STRANGER = """
import gc, time
gc.disable()
while True:
    gc.collect()
    time.sleep(0.001)
"""


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                found.append(int(name))
    return sorted(found)


@pytest.mark.bpf
def test_every_count_is_exact_per_member_and_in_total(require_bpf, tmp_path):
    go, out = tmp_path / "go", tmp_path / "done"
    # Not of the family, on the same interpreter file: the family's GC uprobes fire in it too, and it is never counted.
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER])
    parent = subprocess.Popen([sys.executable, "-c", FAMILY, str(go), str(out)])
    try:
        _wait(lambda: len(_children(parent.pid)) == 3, 20, "three children")
        pids = [parent.pid, *_children(parent.pid)]
        infos = [read_proc(pid) for pid in pids]
        members = tuple(Member(pid=i.pid, start_time=i.start_time, role=f"worker-{n}", cmdline=i.cmdline)
                        for n, i in enumerate(infos))
        spec = TargetSpec(name="family", pid=parent.pid)
        family = Target(name="family", pid=parent.pid, start_time=infos[0].start_time, cmdline=infos[0].cmdline,
                        spec=spec, members=members)
        config = Config(interval_seconds=1.0, targets=(spec,), stacks=StacksConfig(enabled=False),
                        probes=ProbesConfig(tcp=False, runqueue=False, exits=False))
        windows = []
        loop = CollectionLoop(specs=[spec], collectors=build_collectors(config), state=AgentState(),
                              sink=windows.append, interval=1.0, discover_fn=lambda specs, problems: [family])
        try:
            loop.start()
            go.touch()
            _wait(lambda: all(Path(f"{out}.{n}").exists() for n in range(4)), 60, "the work to finish")
            loop.tick()
            time.sleep(0.3)
            loop.tick()
        finally:
            loop.close()
    finally:
        # The children first: once the parent is gone they belong to init and are not found as its children.
        for pid in _children(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
        stranger.kill()
        stranger.wait()

    assert len(windows) == 2
    assert all(m.pid != stranger.pid for w in windows for m in w.members)
    for n, (calls, collections, sleeps) in enumerate(WORK):
        got = [next(m for m in w.members if m.pid == pids[n]) for w in windows]
        assert all(m.role == f"worker-{n}" for m in got)
        assert sum(m.syscalls.get("getppid", 0) for m in got) == calls, n
        assert sum(m.gc_collections for m in got) == collections, n
        slept = sum(m.offcpu_by_kind.get("sleep", 0.0) for m in got)
        # Each 50 ms sleep is at least 50 ms off-CPU in clock_nanosleep; the rest of the process's life it sleeps
        # in the 10 ms poll for the go file and then in its final long sleep, also `sleep`: at least the work's.
        assert slept >= 0.05 * sleeps, (n, slept)
    short = int(Path(f"{out}.short").read_text())
    seen = [m for w in windows for m in w.members if m.pid == short]
    assert len(seen) == 1, "reported once, with its whole life's counts"
    assert seen[0].syscalls["getppid"] == 777 and seen[0].role == "worker-0"  # a fork runs its parent's program
    assert seen[0].offcpu_by_kind.get("sleep", 0.0) >= 0.2
    assert "process" in seen[0].errors  # no process source ever ran for it: said, never a zero
    assert seen[0].gc_collections == 11 and "gc" not in seen[0].errors  # followed by its image's shared uprobes
    # The family's fields are the sums of its members'.
    total_calls = sum(w.syscalls.counts.get("getppid", 0) for w in windows)
    assert total_calls == sum(c for c, _, _ in WORK) + 777
    assert sum(w.gc.collections for w in windows) == sum(g for _, g, _ in WORK) + 11
    for w in windows:
        assert w.gc.collections == sum(m.gc_collections for m in w.members if m.gc_collections is not None)
        assert abs(w.offcpu.seconds - sum(m.offcpu_seconds for m in w.members)) < 1e-6
        # Family stacks carry the member's role as their root frame.
        assert all(stack.split(";")[0].startswith("worker-") for stack in w.offcpu.stacks)


TITLED = r"""
import gc, os, sys, time
from setproctitle import setproctitle
gc.disable()
for role in ("infersight::EngineCore", "infersight::Worker_TP1"):
    if os.fork() == 0:
        setproctitle(role)
        while True:
            for _ in range(500):
                os.getppid()
            gc.collect()
            time.sleep(0.05)
while True:
    time.sleep(0.1)
"""


@pytest.mark.bpf
def test_collect_with_children_gives_one_window_per_tick_with_each_titled_member(require_bpf):
    import json

    parent = subprocess.Popen([sys.executable, "-c", TITLED])
    try:
        _wait(lambda: len(_children(parent.pid)) == 2, 20, "two titled children")
        out = subprocess.run([sys.executable, "-m", "agent.cli", "collect", "--pid", str(parent.pid), "--children",
                              "--duration", "4", "--interval", "2", "--json"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    finally:
        for pid in _children(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
    windows = [json.loads(line) for line in out.splitlines()]
    assert len(windows) == 2
    for w in windows:
        roles = {m["role"]: m for m in w["members"]}
        assert set(roles) >= {"infersight::EngineCore", "infersight::Worker_TP1"}, roles
        assert w["pid"] == parent.pid and roles["infersight::EngineCore"]["pid"] != parent.pid
        # The family's figures are its members' sums; the children are where the GC and the syscalls are.
        assert w["gc"]["collections"] == sum(m["gc_collections"] or 0 for m in w["members"]) > 0
        assert w["syscalls"]["counts"]["getppid"] == sum((m["syscalls"] or {}).get("getppid", 0) for m in w["members"])
        assert roles["infersight::EngineCore"]["gc_collections"] > 0


def test_a_familys_source_health_is_one_entry_per_source_never_per_pid():
    from agent.collectors import _family_health
    from analysis.health import Health

    parts = [(10, Health(name="stacks", state="running", error_count=1)),
             (11, Health(name="stacks", state="unsupported", reason="not a Python process")),
             (12, Health(name="stacks", state="running"))]
    h = _family_health(parts)
    assert h.state == "running" and h.reason is None and h.error_count == 1
    assert h.unsupported == {11: "unsupported: not a Python process"}
    assert h.detail["members"] == {"unsupported": 1, "running": 2}
    down = _family_health([(10, Health(name="stacks", state="failed", reason="py-spy missing")),
                           (11, Health(name="stacks", state="unsupported", reason="not Python"))])
    assert down.state == "failed" and down.reason == "pid 10: py-spy missing"


WITH_A_SHELL = r"""
import gc, os, subprocess, sys, time
gc.disable()
go, out = sys.argv[1], sys.argv[2]
subprocess.Popen(["sleep", "3600"])  # a member that is no Python process: the gc probe cannot trace it
while not os.path.exists(go):
    time.sleep(0.01)
gc.collect()
gc.collect()
child = os.fork()
if child == 0:
    for _ in range(6):
        gc.collect()
    os._exit(0)
os.waitpid(child, 0)
open(out, "w").write(str(child))
while True:
    time.sleep(3600)
"""


@pytest.mark.bpf
def test_a_member_gc_cannot_trace_does_not_stop_the_family_being_followed(require_bpf, tmp_path):
    """The gc probe's start raises Unsupported for the `sleep` member; it must still be told which members to follow,
    or the short-lived child's collections are lost."""
    go, out = tmp_path / "go", tmp_path / "done"
    parent = subprocess.Popen([sys.executable, "-c", WITH_A_SHELL, str(go), str(out)])
    try:
        _wait(lambda: len(_children(parent.pid)) == 1, 20, "the sleep child")
        _wait(lambda: os.readlink(f"/proc/{_children(parent.pid)[0]}/exe").endswith("sleep"), 20, "sleep to run")
        pids = [parent.pid, *_children(parent.pid)]
        infos = [read_proc(pid) for pid in pids]
        members = tuple(Member(pid=i.pid, start_time=i.start_time, role=f"m{n}", cmdline=i.cmdline)
                        for n, i in enumerate(infos))
        spec = TargetSpec(name="family", pid=parent.pid)
        family = Target(name="family", pid=parent.pid, start_time=infos[0].start_time, cmdline=infos[0].cmdline,
                        spec=spec, members=members)
        config = Config(interval_seconds=1.0, targets=(spec,), stacks=StacksConfig(enabled=False),
                        probes=ProbesConfig(syscalls=False, offcpu=False, tcp=False, runqueue=False, exits=False))
        windows = []
        loop = CollectionLoop(specs=[spec], collectors=build_collectors(config), state=AgentState(),
                              sink=windows.append, interval=1.0, discover_fn=lambda specs, problems: [family])
        try:
            loop.start()
            go.touch()
            _wait(lambda: out.exists() and out.read_text(), 60, "the short child to end")
            loop.tick()
        finally:
            loop.close()
    finally:
        for pid in _children(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
    short = int(out.read_text())
    (window,) = windows
    by_pid = {m.pid: m for m in window.members}
    assert by_pid[parent.pid].gc_collections == 2
    assert by_pid[short].gc_collections == 6
    assert by_pid[pids[1]].gc_collections is None and "not a Python interpreter" in by_pid[pids[1]].errors["gc"]
    assert window.gc.collections == 8
