"""Who grew in memory (agent/sources/memory_growers.py): a real process that allocates a known amount is named with
that growth; a pid reused since the reference is a new process; small growth and quiet windows name nobody."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.sources.memory_growers import MIN_GROWTH_BYTES, PAGE_SIZE, GrowthTracker, growers, scan
from agent.sources.pressure import PressureSource

MiB = 1 << 20
ALLOC = 160 * MiB


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_process_that_allocates_is_named_with_what_it_took():
    code = ("import sys\nprint('ready', flush=True); sys.stdin.readline()\n"
            f"b = bytearray({ALLOC})\n"
            "for i in range(0, len(b), 4096): b[i] = 1\n"  # touched: resident, not just reserved
            "print('done', flush=True); sys.stdin.readline()\n")
    child = subprocess.Popen([sys.executable, "-c", code, "--api-token", "s3cr3t"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        clock = Clock()
        tracker = GrowthTracker(clock=clock)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        clock.now += 30.0
        found = tracker.growers(members={child.pid})
    finally:
        child.kill()
        child.wait()
    top = found[0]
    assert top.pid == child.pid and top.member and top.seconds == pytest.approx(30.0)
    # What it allocated, within the interpreter's own small change around it.
    assert ALLOC <= top.grew_bytes <= ALLOC + 8 * MiB, top
    assert top.comm.startswith("python") and top.user == "root"
    assert "--api-token ***" in top.cmdline and "s3cr3t" not in top.cmdline


def _stat(proc: Path, pid: int, start: int, rss_pages: int, comm: str = "job") -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 18 + [str(start), "0", str(rss_pages)] + ["0"] * 20
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")


def test_a_reused_pid_is_a_new_process_and_small_growth_names_nobody(tmp_path):
    proc = tmp_path / "proc"
    big = (MIN_GROWTH_BYTES * 4) // PAGE_SIZE
    _stat(proc, 10, start=100, rss_pages=big)       # will be replaced by another process under the same pid
    _stat(proc, 11, start=100, rss_pages=big)       # grows by less than the floor
    before = scan(proc)
    _stat(proc, 10, start=200, rss_pages=big, comm="new")
    _stat(proc, 11, start=100, rss_pages=big + 10)
    found = growers(scan(proc), before, {11}, 5.0, proc)
    assert [(g.pid, g.comm, g.grew_bytes) for g in found] == [(10, "new", big * PAGE_SIZE)]
    assert found[0].cmdline is None and found[0].user is None  # gone from /proc: not invented


def test_the_reference_is_one_to_two_periods_old(tmp_path):
    proc = tmp_path / "proc"
    _stat(proc, 10, start=1, rss_pages=0)
    clock = Clock()
    tracker = GrowthTracker(proc, reference_seconds=60.0, clock=clock)
    clock.now += 55.0
    _stat(proc, 10, start=1, rss_pages=(MIN_GROWTH_BYTES * 2) // PAGE_SIZE)
    clock.now += 10.0
    tracker.tick()  # renewed just after the growth: the older reference still has it small
    [g] = tracker.growers([])
    assert g.pid == 10 and g.seconds == pytest.approx(65.0)
    clock.now += 60.0
    tracker.tick()  # now both references hold the grown size: nothing grew since
    assert tracker.growers([]) == []


def test_a_window_without_a_memory_stall_reads_nobody_and_says_so(tmp_path):
    proc = tmp_path / "proc"
    _stat(proc, 42, start=1, rss_pages=1, comm="srv")
    (proc / "42" / "cgroup").write_text("0::/srv\n")
    (proc / "vmstat").write_text("pgsteal_kswapd 5\n")
    source = PressureSource(42, proc_root=proc)
    r = source.read()
    assert r.growers is None and "no memory stall" in r.reasons["growers"]
    (proc / "vmstat").write_text("pgsteal_kswapd 9\n")  # reclaim: worth a scan
    _stat(proc, 43, start=5, rss_pages=(MIN_GROWTH_BYTES * 3) // PAGE_SIZE, comm="alloc")
    r = source.read()
    assert [(g.pid, g.member) for g in r.growers] == [(43, False)] and "growers" not in r.reasons
