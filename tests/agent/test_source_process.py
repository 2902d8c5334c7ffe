"""ProcessSource on a real child whose CPU, fds, threads and sleeps are known."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sources.process import ProcessSource, cgroup_frozen, read_threads, switch_deltas, thread_switches
from analysis.errors import TargetGone

CHILD = textwrap.dedent("""
    import os, sys, threading, time
    sys.stdin.readline()                       # wait for "go": the test takes its baseline first
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(sys.argv[1]))]
    for _ in range(int(sys.argv[3])):
        time.sleep(0.002)                      # each sleep is one voluntary context switch at least
    start = time.process_time()
    while time.process_time() - start < float(sys.argv[2]):
        pass
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait) for _ in range(int(sys.argv[4]))]
    for w in workers:
        w.start()
    print(time.process_time() - start, flush=True)
    sys.stdin.readline()
    stop.set()
""")

EXTRA_FDS, BURN_S, SLEEPS, THREADS = 25, 0.6, 50, 3


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(EXTRA_FDS), str(BURN_S), str(SLEEPS), str(THREADS)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield proc
    proc.kill()
    proc.wait()


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime straight from /proc/PID/stat: the ground truth psutil must agree with."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_deltas_match_the_childs_known_behaviour(child: subprocess.Popen) -> None:
    fds_before = len(os.listdir(f"/proc/{child.pid}/fd"))
    cpu_before = proc_cpu_seconds(child.pid)
    src = ProcessSource(child.pid)
    child.stdin.write("go\n")
    child.stdin.flush()
    burned = float(child.stdout.readline())
    reading = src.read()
    cpu_after = proc_cpu_seconds(child.pid)

    assert burned >= BURN_S
    # At least the busy loop, at most it plus the interpreter's work around it (fd opens, sleeps).
    assert burned - 0.02 <= reading.cpu_seconds <= burned + 0.15, (reading.cpu_seconds, burned)
    assert reading.cpu_seconds == pytest.approx(cpu_after - cpu_before, abs=0.03)
    # fds_before may catch the child's interpreter still starting (a file it has open for a moment), so the
    # ground truth is the listing now: its stdio plus the EXTRA_FDS it opened.
    assert reading.fds == len(os.listdir(f"/proc/{child.pid}/fd")) >= 3 + EXTRA_FDS
    assert reading.fds >= fds_before + EXTRA_FDS - 1
    assert reading.threads == 1 + THREADS
    assert reading.voluntary_ctx_switches >= SLEEPS
    assert reading.rss_bytes > 5 * 2**20

    again = src.read()
    assert again.cpu_seconds < 0.05, "cpu seconds are a delta, not a running total"
    assert again.voluntary_ctx_switches < SLEEPS


def test_gone_target_raises_target_gone_and_counts(child: subprocess.Popen) -> None:
    src = ProcessSource(child.pid)
    child.kill()
    child.wait()
    with pytest.raises(TargetGone, match=str(child.pid)):
        src.read()
    health = src.health()
    assert health.state == "failed" and health.error_count == 1


def test_zombie_target_is_gone(child: subprocess.Popen) -> None:
    src = ProcessSource(child.pid)
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    with pytest.raises(TargetGone):
        src.read()


def test_missing_pid_at_construction_is_target_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(TargetGone, match=str(proc.pid)):
        ProcessSource(proc.pid)


def test_bad_pid_quotes_the_value() -> None:
    with pytest.raises(ValueError, match="-3"):
        ProcessSource(-3)


# Worker threads sleep (voluntary switches) while the main thread blocks on a barrier: a server's shape, where the
# main thread is the one that does least. They stay alive until told, so the read sees all of them.
THREADED = textwrap.dedent("""
    import sys, threading, time
    sys.stdin.readline()
    stop, slept = threading.Event(), threading.Barrier(int(sys.argv[1]) + 1)
    def sleeper():
        for _ in range(int(sys.argv[2])):
            time.sleep(0.001)
        slept.wait()
        stop.wait()
    for _ in range(int(sys.argv[1])):
        threading.Thread(target=sleeper).start()
    slept.wait()
    print("slept", flush=True)
    sys.stdin.readline()
    stop.set()
""")


def test_context_switches_are_summed_over_every_thread() -> None:
    workers, sleeps = 3, 200
    proc = subprocess.Popen([sys.executable, "-c", THREADED, str(workers), str(sleeps)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        src = ProcessSource(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "slept"
        reading = src.read()
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert os.waitstatus_to_exitcode(status) == 0
    # Each worker's sleeps are one voluntary switch each at least; the main thread alone (what /proc/PID/status
    # holds) made a handful while it waited.
    assert reading.voluntary_ctx_switches >= workers * sleeps, reading
    # Ground truth from the kernel's own rusage of the reaped child (every thread, exited ones included): the
    # window cannot hold more than the whole life did.
    assert reading.voluntary_ctx_switches <= usage.ru_nvcsw, (reading, usage.ru_nvcsw)
    assert reading.involuntary_ctx_switches <= usage.ru_nivcsw, (reading, usage.ru_nivcsw)
    assert usage.ru_nvcsw - reading.voluntary_ctx_switches < workers * sleeps / 2, "most of the life was missed"


def test_thread_switches_parses_each_task_and_skips_a_thread_that_left(tmp_path) -> None:
    for tid, (v, n) in {41: (10, 2), 42: (300, 7)}.items():
        (tmp_path / "41" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "41" / "task" / str(tid) / "status").write_text(
            f"Name:\tpython\nvoluntary_ctxt_switches:\t{v}\nnonvoluntary_ctxt_switches:\t{n}\n")
    (tmp_path / "41" / "task" / "43").mkdir()  # listed, then exited before its status was read
    assert thread_switches(41, str(tmp_path)) == {41: (10, 2), 42: (300, 7)}
    with pytest.raises(FileNotFoundError):
        thread_switches(99, str(tmp_path))


def test_read_threads_keeps_each_threads_state_letter_and_skips_a_status_without_one(tmp_path) -> None:
    for tid, state in {41: "S (sleeping)", 42: "T (stopped)", 43: "D (disk sleep)", 44: "t (tracing stop)"}.items():
        (tmp_path / "41" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "41" / "task" / str(tid) / "status").write_text(
            f"Name:\tpython\nState:\t{state}\nvoluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t2\n")
    (tmp_path / "41" / "task" / "45").mkdir()
    (tmp_path / "41" / "task" / "45" / "status").write_text("Name:\tpython\n")  # no counters: not counted
    (tmp_path / "41" / "task" / "46").mkdir()
    (tmp_path / "41" / "task" / "46" / "status").write_text(  # counters without a state: counted, state unknown
        "voluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t2\n")
    assert {tid: t.state for tid, t in read_threads(41, str(tmp_path)).items()} == {41: "S", 42: "T", 43: "D",
                                                                                    44: "t", 46: "?"}


def test_a_stopped_process_reads_every_thread_stopped_and_none_once_continued(child) -> None:
    src = ProcessSource(child.pid)
    assert src.read().stopped_threads == 0
    child.stdin.write("go\n")
    child.stdin.flush()
    child.stdout.readline()  # its worker threads are up
    os.kill(child.pid, signal.SIGSTOP)
    try:
        # The stop reaches every thread; wait for the kernel to take them all off the CPU (a few ms).
        deadline = time.monotonic() + 5
        while (reading := src.read()).stopped_threads < reading.threads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reading.threads == THREADS + 1 and reading.stopped_threads == reading.threads
        assert reading.disk_wait_threads == 0
    finally:
        os.kill(child.pid, signal.SIGCONT)
    deadline = time.monotonic() + 5
    while (reading := src.read()).stopped_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reading.stopped_threads == 0


def test_switch_deltas_count_new_threads_whole_and_restart_a_recycled_tid() -> None:
    prev = {1: (100, 5), 2: (50, 1), 3: (9, 9)}
    now = {1: (130, 6), 2: (20, 0), 4: (7, 2)}  # 2 recycled (counts went down), 3 exited, 4 new
    assert switch_deltas(prev, now) == (30 + 20 + 7, 1 + 0 + 2)
    assert switch_deltas(now, now) == (0, 0)


def _cgroup_files(tmp_path, proc_cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    proc, root = tmp_path / "proc", tmp_path / "cg"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text(proc_cgroup)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return str(proc), str(root)


@pytest.mark.parametrize(("proc_cgroup", "files", "frozen"), [
    ("0::/pod/a\n", {"pod/a/cgroup.events": "populated 1\nfrozen 1\n"}, True),
    ("0::/pod/a\n", {"pod/a/cgroup.events": "populated 1\nfrozen 0\n"}, False),
    # hybrid hosts (this one): v2 on unified/, v1 controllers beside it
    ("4:memory:/x\n0::/pod/a\n", {"unified/pod/a/cgroup.events": "populated 1\nfrozen 1\n"}, True),
    ("5:freezer:/pod/a\n0::/\n", {"freezer/pod/a/freezer.state": "FROZEN\n"}, True),
    ("5:freezer:/pod/a\n0::/\n", {"freezer/pod/a/freezer.state": "THAWED\n"}, False),
    ("0::/pod/a\n", {}, False),  # no cgroup.events to read: not frozen, not an error
    ("0::/\n", {"cgroup.events": "frozen 1\n"}, False),  # the root cgroup cannot be frozen
])
def test_cgroup_frozen_reads_v2_events_hybrid_and_v1_freezer(tmp_path, proc_cgroup, files, frozen) -> None:
    proc, root = _cgroup_files(tmp_path, proc_cgroup, files)
    assert cgroup_frozen(7, proc_root=proc, cgroup_root=root) is frozen


def test_cgroup_frozen_of_a_process_that_left_is_false(tmp_path) -> None:
    assert cgroup_frozen(7, proc_root=str(tmp_path), cgroup_root=str(tmp_path)) is False


FREEZE = Path(__file__).resolve().parents[1] / "scenarios" / "freeze.py"


def test_a_frozen_cgroup_reads_every_thread_stopped_though_proc_says_sleeping(require_root, child) -> None:
    src = ProcessSource(child.pid)
    child.stdin.write("go\n")
    child.stdin.flush()
    child.stdout.readline()  # its worker threads are up
    freeze = subprocess.Popen([sys.executable, str(FREEZE), str(child.pid), "30", "9000", "10000"],
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 5
        while (reading := src.read()).stopped_threads < reading.threads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reading.threads == THREADS + 1 and reading.stopped_threads == reading.threads, freeze.poll()
        assert all(t.state not in ("T", "t") for t in read_threads(child.pid).values())
    finally:
        freeze.terminate()
        assert freeze.wait(10) == 0, freeze.stderr.read()
    assert src.read().stopped_threads == 0
