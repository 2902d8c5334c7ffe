"""Tests for probes/offcpu.py: rendering without root, and real sched_switch tracing against child processes."""

from __future__ import annotations

import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from probes.offcpu import OffCpuConfig, OffCpuProbe, render

SLEEPER_C = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long sleep_ns(long long ns) {
    struct timespec req = {ns / 1000000000LL, ns % 1000000000LL};
    long long a = now_ns();
    nanosleep(&req, NULL);
    return now_ns() - a;
}

int main(void) {
    char c;
    if (read(0, &c, 1) != 1) return 1;
    long long total = 0;
    for (int i = 0; i < 20; i++) total += sleep_ns(50000000LL);
    total += sleep_ns(1200000000LL);  /* spans several windows */
    printf("%lld\n", total);
    fflush(stdout);
    return read(0, &c, 1) == 1 ? 0 : 2;
}
"""

# After "go", a new worker thread blocks on a threading.Lock that the main thread holds for HOLD seconds.
LOCK_CHILD = r"""
import sys, threading, time
HOLD = 1.0
lock = threading.Lock()
lock.acquire()
def worker():
    print(threading.get_native_id(), flush=True)
    lock.acquire()
sys.stdin.readline()
t = threading.Thread(target=worker)
t.start()
time.sleep(HOLD)
lock.release()
t.join()
sys.stdin.readline()
"""

# Every thread alternates spinning and sleeping, so windows mix on- and off-CPU time.
MIXED_CHILD = r"""
import sys, threading, time
def busy():
    while True:
        end = time.perf_counter() + 0.004
        while time.perf_counter() < end:
            pass
        time.sleep(0.006)
for _ in range(2):
    threading.Thread(target=busy, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
"""


def test_render_defines_limits_and_user_stacks_switch() -> None:
    text = render(OffCpuConfig(max_targets=3, stack_slots=128))
    assert "#define MAX_TARGETS 3\n" in text
    assert "#define STACK_SLOTS 128\n" in text
    assert "#define USER_STACKS" not in text
    assert "#define USER_STACKS 1" in render(OffCpuConfig(user_stacks=True))
    assert "TRACEPOINT_PROBE(sched, sched_switch)" in text
    assert "kprobe" not in text.lower()


def test_render_stack_switches() -> None:
    assert "#define KERNEL_STACKS 1" in render(OffCpuConfig())
    assert "#define KERNEL_STACKS" not in render(OffCpuConfig(kernel_stacks=False))


def test_config_rejects_bad_values_quoting_them() -> None:
    with pytest.raises(ValueError, match="max_threads.*-4"):
        OffCpuConfig(max_threads=-4)


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _finish(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(timeout=10)


def _nanosleep_us(stacks: dict[str, int]) -> int:
    return sum(us for folded, us in stacks.items() if "do_nanosleep" in folded)


def _sleep_phase_us(stacks: dict[str, int]) -> int:
    """Off-CPU time except the child's waits on its stdin pipe before and after the sleeps.

    Preemptions inside the child's timed intervals (say, between the wakeup and clock_gettime)
    are off-CPU time the child's own clock includes, under their own stacks, so they count too.
    """
    return sum(us for folded, us in stacks.items()
               if "pipe_read" not in folded and not folded.startswith("[blocked since before tracing]"))


@pytest.mark.flaky(reruns=2, reason="exact timing against schedstat/sleeps; this VM's hypervisor steal (30-130 ms per 0.3 s seen) can land in a window")
@pytest.mark.bpf
def test_known_sleeps_within_3_percent_across_windows(require_bpf, cc) -> None:
    child = _spawn([str(cc(SLEEPER_C, "sleeper"))])
    probe = OffCpuProbe()
    lengths_us = []
    try:
        probe.start([child.pid])
        probe.read()
        child.stdin.write("g")
        child.stdin.flush()
        windows = []
        deadline = time.monotonic() + 20
        done = False
        while not done and time.monotonic() < deadline:
            # The child prints after its last sleep returned, so a read after that has it all.
            done = bool(select.select([child.stdout], [], [], 0.25)[0])
            windows.append(probe.read()[child.pid])
            lengths_us.append((probe.window_end_ns - probe.window_start_ns) / 1000)
        truth_ns = int(child.stdout.readline())
        child.stdin.write("x")
        child.stdin.flush()
        health = probe.health()
    finally:
        probe.stop()
        _finish(child)

    measured_us = sum(_sleep_phase_us(w.stacks) for w in windows)
    assert measured_us == pytest.approx(truth_ns / 1000, rel=0.03), (measured_us, truth_ns)
    # The 1.2 s sleep spans several 0.25 s windows: each shows (nearly) its whole length asleep.
    full = [i for i, w in enumerate(windows) if _nanosleep_us(w.stacks) > 0.97 * lengths_us[i]]
    assert len(full) >= 3, [(_nanosleep_us(w.stacks), round(n)) for w, n in zip(windows, lengths_us)]
    assert max(max(w.histogram.counts or [0]) for w in windows) > 0
    # 20 sleeps of 50 ms: slot 15 ([32, 64) ms), or 16-17 when a loaded CPU or the hypervisor's steal
    # (30-130 ms per 0.3 s seen on this VM) delays the wakeup by more than 14 ms.
    hist = [0] * 32
    for w in windows:
        for slot, count in enumerate(w.histogram.counts):
            hist[slot] += count
    assert hist[15] + hist[16] + hist[17] >= 20, hist
    assert hist[20] >= 1, hist  # the 1.2 s sleep: [1.05, 2.1) s
    assert health.state == "running" and health.failed_stacks == 0 and health.lost_events == 0


def _schedstat_ns(pid: int, tid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def _steal_ns() -> int:
    """Host-wide steal time (all CPUs) from /proc/stat, which counts it in USER_HZ=100 ticks."""
    return int(Path("/proc/stat").read_text().split("\n", 1)[0].split()[8]) * 10_000_000


@pytest.mark.flaky(reruns=2, reason="exact timing against schedstat/sleeps; this VM's hypervisor steal (30-130 ms per 0.3 s seen) can land in a window")
@pytest.mark.bpf
def test_off_plus_on_cpu_equals_wall_per_thread_and_window(require_bpf, python_exe) -> None:
    """on (schedstat) + off (probe) = wall, per thread and 0.3 s window, within a stated budget.

    Over wall (double counting) the budget is tight: 1% + 5 ms + the gaps between sampling
    schedstat and the kernel taking each boundary inside read() (the test process can be
    descheduled in between on this loaded 2-CPU VM). The 5 ms: schedstat's sum for a running
    thread is brought up to date only at ticks (CONFIG_HZ=250) and switches.
    Under wall it also allows the VM's steal time of the window and the next as /proc/stat shows
    it, plus 20 ms: when the hypervisor stops a vCPU while a target thread runs, the guest clock
    advances but CONFIG_PARAVIRT_TIME_ACCOUNTING leaves it out of the thread's on-CPU sum and no
    switch happens, so that stretch is in neither number; /proc/stat books steal late (capped
    per tick) and in 10 ms units, so it cannot be subtracted exactly.
    Measured here (15 windows x 2 busy threads, repeated): most pairs match to 0.1 ms; 1 pair in
    8 missed 2-14 ms, always under wall; the BPF program had 0 recursion misses meanwhile.
    Hence also, net of each pair's sampling gaps: no double counting in the median pair, all of it
    together under 2% of thread-time, and per window the time missing from on + off no more than
    the steal /proc/stat reports (this VM's host took 30-130 ms of each 0.3 s window at times).
    """
    child = _spawn([python_exe, "-c", MIXED_CHILD])
    assert child.stdout.readline().strip() == "ready"
    tids = sorted(int(p.name) for p in Path(f"/proc/{child.pid}/task").iterdir())
    samples: list[tuple[int, dict[int, int], int]] = []  # (time, on-CPU ns per tid, steal ns)
    bounds: list[int] = []
    probe = OffCpuProbe()
    try:
        probe.start([child.pid])
        probe.read()  # the first read loads kallsyms (~0.7 s); keep that out of the windows
        windows = []
        for i in range(7):
            if i:
                time.sleep(0.3)
            on = {t: _schedstat_ns(child.pid, t) for t in tids}
            samples.append((time.monotonic_ns(), on, _steal_ns()))
            windows.append(probe.read()[child.pid])
            bounds.append(probe.window_end_ns)
    finally:
        probe.stop()
        _finish(child)

    assert len(tids) == 3
    over = []  # double counting, net of the test's own sampling gaps
    for i in range(1, len(windows)):
        reading = windows[i]
        wall = bounds[i] - bounds[i - 1]
        gaps = (bounds[i] - samples[i][0]) + (bounds[i - 1] - samples[i - 1][0])
        stolen = samples[min(i + 1, len(samples) - 1)][2] - samples[i - 1][2]
        under = 0.0
        for tid in tids:
            on = samples[i][1][tid] - samples[i - 1][1][tid]
            off = reading.by_thread.get(tid, 0.0) * 1e9
            miss = wall - on - off
            # The thread may run between our schedstat sample and the kernel's boundary: up to `gaps`
            # of any miss is the test's own sampling, not the probe's error.
            over.append(max(0.0, -miss - gaps))
            under += max(0.0, miss - gaps)
            budget = 0.01 * wall + 5e6 + gaps
            assert -budget <= miss <= budget + stolen + 20e6, (i, tid, on, off, wall, gaps, stolen)
        # Time missing from on + off is time the hypervisor took from the vCPUs, never more (10 ms:
        # /proc/stat books steal in 10 ms units, and schedstat's running sum lags by up to a tick).
        assert under <= stolen + 10e6, (i, under, stolen)
    assert sorted(over)[len(over) // 2] < 1e6, over  # the median pair does not double count at all
    assert sum(over) < 0.02 * (bounds[-1] - bounds[0]) * len(tids), over
    # The spinning threads are on-CPU a real share of the time, so the check is not trivial.
    assert samples[-1][1][tids[1]] - samples[0][1][tids[1]] > 0.1 * (bounds[-1] - bounds[0])


@pytest.mark.bpf
def test_thread_blocked_on_lock_shows_futex_stack(require_bpf, python_exe) -> None:
    child = _spawn([python_exe, "-c", LOCK_CHILD])
    probe = OffCpuProbe()
    try:
        probe.start([child.pid])
        probe.read()
        child.stdin.write("go\n")
        child.stdin.flush()
        worker_tid = int(child.stdout.readline())
        time.sleep(1.3)
        reading = probe.read()[child.pid]
        child.stdin.write("end\n")
        child.stdin.flush()
    finally:
        probe.stop()
        _finish(child)

    futex = {s: us for s, us in reading.stacks.items() if "futex" in s}
    assert futex, reading.stacks
    assert max(futex.values()) > 0.8e6, futex
    assert reading.by_thread[worker_tid] > 0.8


@pytest.mark.bpf
def test_targets_change_without_reload_and_exited_target_is_dropped(require_bpf) -> None:
    first = subprocess.Popen(["sleep", "30"])
    second = subprocess.Popen(["sleep", "30"])
    probe = OffCpuProbe()
    try:
        probe.start([first.pid])
        loaded = probe._bpf
        time.sleep(0.2)
        assert set(probe.read()) == {first.pid}
        probe.set_targets([second.pid])
        time.sleep(0.3)
        reading = probe.read()
        assert set(reading) == {second.pid}
        # `sleep` was blocked before it became a target: the seeded record still counts its time.
        assert reading[second.pid].seconds == pytest.approx(0.3, abs=0.1)
        # Its stack was never walked by the kernel: /proc/TID/stack names it, under a marker root.
        (stack,) = reading[second.pid].stacks
        assert stack.startswith("[blocked since before tracing];") and stack.endswith("nanosleep"), stack
        second.kill()
        second.wait()
        assert probe.read() == {}
        assert probe._bpf is loaded
        assert probe.health().targets == 0
    finally:
        probe.stop()
        for child in (first, second):
            _finish(child)
    probe.stop()  # idempotent
    assert probe.health().state == "stopped"


@pytest.mark.bpf
def test_failed_stack_ids_are_counted(require_bpf, python_exe) -> None:
    # One stack slot: the second distinct kernel stack collides and gets -EEXIST.
    child = _spawn([python_exe, "-c", LOCK_CHILD])
    probe = OffCpuProbe(OffCpuConfig(stack_slots=1))
    try:
        probe.start([child.pid])
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(1.2)
        stacks = probe.read()[child.pid].stacks
        failed = probe.health().failed_stacks
        child.stdin.write("end\n")
        child.stdin.flush()
    finally:
        probe.stop()
        _finish(child)
    assert failed > 0
    assert any(s.startswith("[kernel stack failed: -17]") for s in stacks), stacks


@pytest.mark.bpf
def test_user_stacks_are_symbolised_before_the_kernel_part(require_bpf, cc) -> None:
    child = _spawn([str(cc(SLEEPER_C, "sleeper_u"))])
    probe = OffCpuProbe(OffCpuConfig(user_stacks=True))
    try:
        probe.start([child.pid])
        child.stdin.write("g")
        child.stdin.flush()
        time.sleep(0.6)
        stacks = probe.read()[child.pid].stacks
        failed = probe.health().failed_stacks
    finally:
        probe.stop()
        _finish(child)
    sleeps = [s for s in stacks if s.endswith("do_nanosleep;schedule;__schedule")]
    assert sleeps, stacks
    user, kernel = sleeps[0].split(";-;")
    assert "nanosleep" in user  # libc's wrapper: the user stack's leaf frame, walked from its IP
    assert kernel.startswith("entry_SYSCALL_64")
    # Kernel and user stacks share one hash-bucketed stack map without BPF_F_REUSE_STACKID (as bcc's offcputime), so
    # two of the child's few dozen distinct stacks can land in one bucket: -EEXIST, counted in health and shown as
    # such (2 of 60 runs here counted one; the one shown was -17). A walk that fails for another reason (-EFAULT: no
    # usable user memory) fails here. A thread already blocked when tracing began is seeded from /proc with no user
    # stack (-1): not a walk.
    failures = [s for s in stacks if "stack failed:" in s and "[blocked since before tracing]" not in s]
    assert all(e == "-17" for s in failures for e in re.findall(r"stack failed: (-?\d+)\]", s)), failures
    assert failed <= 2, failed  # a walk that failed every time would count one per switch-out: 20 and more


@pytest.mark.bpf
def test_rapid_windows_neither_lose_nor_double_count(require_bpf, python_exe) -> None:
    """150 windows of ~5 ms while threads switch every few ms: the cuts race the switch-ins all
    the time. Summed over the run, off + on must still equal wall per thread (budget as in the
    per-window test: 1% + 5 ms + the sampling gaps, plus steal and 20 ms below wall)."""
    child = _spawn([python_exe, "-c", MIXED_CHILD])
    assert child.stdout.readline().strip() == "ready"
    tids = sorted(int(p.name) for p in Path(f"/proc/{child.pid}/task").iterdir())
    probe = OffCpuProbe()
    off = dict.fromkeys(tids, 0.0)
    try:
        probe.start([child.pid])
        probe.read()
        sampled_before, on_before, steal_before = time.monotonic_ns(), \
            {t: _schedstat_ns(child.pid, t) for t in tids}, _steal_ns()
        probe.read()
        first = probe.window_end_ns
        for i in range(151):
            if i == 150:
                sampled_after, on_after = time.monotonic_ns(), {t: _schedstat_ns(child.pid, t) for t in tids}
            else:
                time.sleep(0.005)
            for tid, seconds in probe.read()[child.pid].by_thread.items():
                off[tid] += seconds
        last = probe.window_end_ns
        stolen = _steal_ns() - steal_before
    finally:
        probe.stop()
        _finish(child)
    wall = last - first
    gaps = (first - sampled_before) + (last - sampled_after)
    for tid in tids:
        on = on_after[tid] - on_before[tid]
        miss = wall - on - off[tid] * 1e9
        budget = 0.01 * wall + 5e6 + gaps
        assert -budget <= miss <= budget + stolen + 20e6, (tid, on, off[tid], wall, gaps, stolen)
