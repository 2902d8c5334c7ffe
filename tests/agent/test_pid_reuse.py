"""A watched target exits and an unprivileged user's process takes its pid: neither py-spy nor a uprobe reaches it.

The new process gets the old pid for real: the host's ns_last_pid is set to pid - 1 right before the fork
(pid namespaces would not do here: the BPF programs see host tgids). Another process on the host may fork in
between and take the pid first; the scenario is then run again with a new target.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from agent.collectors import Collectors
from agent.config import TargetSpec
from agent.sources.pyspy import PySpySampler
from agent.targets import Target, discover
from analysis.errors import TargetGone

pytestmark = pytest.mark.root

NOBODY = 65534
# World-readable and executable: the unprivileged user's process runs it too (the venv lives under /root).
SYSTEM_PYTHON = "/usr/bin/python3.11"
ATTEMPTS = 5

SPINNER = textwrap.dedent("""
    import sys
    def {name}():
        while True:
            pass
    print("ready", flush=True)
    {name}()
""")

# One round of collections per line on stdin, counted by the process itself (gc.callbacks).
GC_CHILD = textwrap.dedent("""
    import gc, sys
    gc.disable()
    print("ready", flush=True)
    n = [0]
    def cb(phase, info):
        if phase == "stop":
            n[0] += 1
    gc.callbacks.append(cb)
    for line in sys.stdin:
        n[0] = 0
        gc.enable()
        keep = [[i] for i in range(20000)]
        for _ in range(30):
            gc.collect()
        for _ in range(20000):
            a = [[]]
            a[0].append(a)
        gc.disable()
        print(n[0], flush=True)
""")


def _ready(proc: subprocess.Popen) -> subprocess.Popen:
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _take_pid(pid: int, argv: list[str], **kw) -> subprocess.Popen | None:
    """`argv` started as nobody with exactly `pid`; None when another process took the pid first."""
    for _ in range(20):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(argv, user=NOBODY, group=NOBODY, extra_groups=[], stdout=subprocess.PIPE,
                                text=True, **kw)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
        if os.path.exists(f"/proc/{pid}"):
            return None
    return None


def _gc_round(proc: subprocess.Popen) -> int:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return int(proc.stdout.readline())


def _finish(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait(timeout=10)


def _pyspy_on(pid: int) -> list[int]:
    """py-spy processes of this test reading `pid`."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if any(a.endswith("py-spy") for a in argv) and "--pid" in argv and argv[argv.index("--pid") + 1] == str(pid):
            found.append(child.pid)
    return found


def _in_turns(scenario: Callable[[], bool]) -> None:
    for _ in range(ATTEMPTS):
        if scenario():
            return
    pytest.fail(f"another process took the freed pid first in all {ATTEMPTS} attempts")


def _discovered(pid: int) -> Target:
    (target,) = discover([TargetSpec(name="a", pid=pid)], allowed_uids=frozenset({0}))
    return target


def test_no_pyspy_ever_reads_the_process_that_takes_an_exited_targets_pid(require_root) -> None:
    def scenario() -> bool:
        a = _ready(subprocess.Popen([sys.executable, "-c", SPINNER.format(name="target_a_spins")],
                                    stdout=subprocess.PIPE, text=True))
        target = _discovered(a.pid)
        sampler = PySpySampler(a.pid, rate_hz=49, segment_seconds=1, start_time=target.start_time,
                               allowed_uids=frozenset({0}))
        c = None
        try:
            deadline = time.monotonic() + 60
            while sampler.health().detail["segments"] < 2:
                assert time.monotonic() < deadline, f"py-spy recorded nothing of the target: {sampler.health()}"
                time.sleep(0.1)
            assert any("target_a_spins" in s for s in sampler.read().active)
            a.kill()
            a.wait()
            c = _take_pid(a.pid, [SYSTEM_PYTHON, "-c", SPINNER.format(name="user_c_spins")])
            if c is None:
                return False
            _ready(c)
            assert psutil.Process(c.pid).uids().real == NOBODY
            # Two segments' time: the old code launched a recorder on the pid every segment.
            watch_until = time.monotonic() + 3
            while time.monotonic() < watch_until:
                assert _pyspy_on(c.pid) == [], "a py-spy runs on the user's process"
                time.sleep(0.05)
            with pytest.raises(TargetGone):
                sampler.read()
            health = sampler.health()
            assert health.reason and "exited" in health.reason and sampler.child_pids() == []
            return True
        finally:
            sampler.close()
            _finish(a, c)

    _in_turns(scenario)


@pytest.mark.bpf
def test_an_exited_target_leaves_the_gc_filter_at_once_and_its_pid_is_never_counted(require_bpf) -> None:
    def scenario() -> bool:
        a = _ready(subprocess.Popen([SYSTEM_PYTHON, "-c", GC_CHILD], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True))
        target = _discovered(a.pid)
        collectors = Collectors(["gc"])
        c = None
        try:
            collectors.start([target])
            probe = collectors._running["gc"]
            filter_map = probe._bpf[b"targets"]
            key = filter_map.Key(a.pid)
            collectors.read()
            count = _gc_round(a)
            assert count > 30 and collectors.read()[target.key].readings["gc"].collections == count
            a.kill()
            exited = time.monotonic()
            while key in filter_map:  # out of the in-kernel filter as soon as the pidfd says so
                assert time.monotonic() - exited < 5, "the exited target stayed in the gc filter"
                time.sleep(0.001)
            a.wait()
            c = _take_pid(a.pid, [SYSTEM_PYTHON, "-c", GC_CHILD], stdin=subprocess.PIPE)
            if c is None:
                return False
            _ready(c)
            totals = probe._bpf[b"totals"]
            before = totals[totals.Key(c.pid)].count if totals.Key(c.pid) in totals else 0  # the target's own
            assert _gc_round(c) > 30  # the user's process really collected, in the same interpreter binary
            after = totals[totals.Key(c.pid)].count if totals.Key(c.pid) in totals else 0
            assert after == before, f"{after - before} of the user's collections were counted"
            collected = collectors.read()[target.key]
            assert "gc" not in collected.readings
            assert "exited" in collected.missing["gc"], collected.missing
            assert probe.method(c.pid) is None
            return True
        finally:
            collectors.stop()
            _finish(a, c)

    _in_turns(scenario)


@pytest.mark.bpf
def test_a_target_whose_pid_changed_hands_before_the_attach_is_never_attached(require_bpf) -> None:
    def scenario() -> bool:
        a = _ready(subprocess.Popen([SYSTEM_PYTHON, "-c", GC_CHILD], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True))
        target = _discovered(a.pid)  # discovered, then gone before the probes get to it
        a.kill()
        a.wait()
        collectors = Collectors(["gc"])
        c = None
        try:
            c = _take_pid(a.pid, [SYSTEM_PYTHON, "-c", GC_CHILD], stdin=subprocess.PIPE)
            if c is None:
                return False
            _ready(c)
            collectors.start([])
            collectors.set_targets([target])
            probe = collectors._running["gc"]
            assert probe.method(c.pid) is None, "the gc probe attached to the user's process"
            collectors.read()
            assert _gc_round(c) > 30
            collected = collectors.read()[target.key]
            assert "gc" not in collected.readings
            assert "names another process" in collected.missing["gc"], collected.missing
            return True
        finally:
            collectors.stop()
            _finish(c)

    _in_turns(scenario)
