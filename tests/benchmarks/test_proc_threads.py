"""benchmarks.proc_threads: the independent /proc reading parses a thread's counters and turns two readings into
one second's figures."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.proc_threads import (
    ThreadSample,
    parse_schedstat,
    parse_stat_cpu,
    parse_switches,
    read_threads,
    row,
    watch,
)

# A comm with a space and a ')' in it, as a thread can name itself: fields are counted after the last ')'.
STAT = ("4242 (py thr) (x)) R 1 4242 4242 0 -1 4194304 1200 0 0 0 {utime} {stime} 0 0 20 0 35 0 "
        "123456 1234567 890 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 1 0 0 0 0 0\n")
STATUS = "Name:\tpython\nState:\tR (running)\nvoluntary_ctxt_switches:\t{vol}\nnonvoluntary_ctxt_switches:\t{invol}\n"


def fake_proc(root: Path, pid: int, threads: dict[int, tuple[int, int, int, int, int]]) -> None:
    """threads: tid -> (utime ticks, stime ticks, run delay ns, voluntary, involuntary)."""
    total_u = sum(t[0] for t in threads.values())
    total_s = sum(t[1] for t in threads.values())
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(STAT.format(utime=total_u, stime=total_s))
    for tid, (u, s, delay, vol, invol) in threads.items():
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True, exist_ok=True)
        (task / "stat").write_text(STAT.format(utime=u, stime=s))
        (task / "schedstat").write_text(f"987654321 {delay} 4321\n")
        (task / "status").write_text(STATUS.format(vol=vol, invol=invol))


def test_parses_one_threads_counters() -> None:
    assert parse_stat_cpu(STAT.format(utime=150, stime=50), tick=100) == 2.0
    assert parse_schedstat("987654321 2500000000 4321\n") == 2.5
    assert parse_switches(STATUS.format(vol=17, invol=3)) == (17, 3)
    assert parse_switches("Name:\tx\n") == (0, 0)


def test_two_readings_give_the_busiest_thread_and_the_run_queue_wait(tmp_path: Path) -> None:
    fake_proc(tmp_path, 4242, {4242: (10, 0, 0, 5, 0), 4250: (100, 20, 1_000_000_000, 50, 10)})
    before = read_threads(4242, tmp_path, tick=100)
    assert before[4250] == ThreadSample(1.2, 1.0, 50, 10)
    # One second later: the decode thread 4250 ran 0.9 s and waited 0.4 s runnable; 4242 ran 0.05 s;
    # a new thread 4260 appeared with 0.02 s.
    fake_proc(tmp_path, 4242, {4242: (15, 0, 100_000_000, 6, 0), 4250: (180, 30, 1_400_000_000, 80, 30),
                               4260: (2, 0, 0, 1, 0)})
    after = read_threads(4242, tmp_path, tick=100)
    r = row(before, after, cpu_before=1.3, cpu_after=2.27, dt=1.0, t=1000.0, load1=0.5, tid=4250)
    assert r.threads == 3 and r.top_tid == 4250
    assert r.top_cores == pytest.approx(0.9) and r.top_runq_s_per_s == pytest.approx(0.4)
    assert r.runq_s_per_s == pytest.approx(0.5)
    assert r.process_cores == pytest.approx(0.97)
    assert r.runq_per_cpu_s == pytest.approx(0.5 / 0.97)
    assert r.ctxsw_per_s == pytest.approx(1 + 50 + 1) and r.invol_ctxsw_per_s == pytest.approx(20)
    assert r.tid_cores == pytest.approx(0.9) and r.tid_runq_s_per_s == pytest.approx(0.4)
    assert row(before, after, 1.3, 2.27, 1.0, 1000.0, 0.5, tid=1).tid_cores is None


def test_an_idle_process_does_not_inflate_the_wait_per_cpu_second(tmp_path: Path) -> None:
    fake_proc(tmp_path, 7, {7: (0, 0, 0, 0, 0)})
    before = read_threads(7, tmp_path, tick=100)
    fake_proc(tmp_path, 7, {7: (0, 0, 10_000_000, 1, 0)})
    r = row(before, read_threads(7, tmp_path, tick=100), 0.0, 0.0, 1.0, 0.0, 0.0)
    assert r.runq_per_cpu_s == pytest.approx(0.01 / 0.05)


def test_watch_reads_a_live_process_until_it_exits(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    out = io.StringIO()
    try:
        rows = watch(child.pid, tmp_path / "r.csv", interval=0.3, out=out)
    finally:
        child.kill()
        child.wait()
    assert rows >= 2, out.getvalue()
    with (tmp_path / "r.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == rows and table[0]["threads"] == "1"
    assert max(float(r["top_cores"]) for r in table) > 0.1  # the spinning thread was seen running
