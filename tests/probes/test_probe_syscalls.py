"""The syscalls probe against ground truth: C children that count their own syscalls."""

from __future__ import annotations

import os
import re
import select
import subprocess
from pathlib import Path

import pytest

from analysis.errors import ProbeUnavailable
from analysis.window import Log2Histogram
from probes import c_helpers, target_filter
from probes.base import TargetSlots
from probes.syscall_names import SYSCALL_NAMES
from probes.syscalls import (
    BPF_TEXT,
    OTHER_ID,
    SyscallsConfig,
    SyscallsProbe,
    render,
    syscall_name,
)

UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")

# Prints "ready", waits for one byte on stdin, then makes exactly N getcpu calls with PER
# getppid calls after each, while THREADS extra threads spin on getppid; prints what it did
# and waits for EOF on stdin so that it is still alive when the probe is read.
CHILD_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;

static void *spin(void *arg)
{
    long *n = arg, local = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        syscall(SYS_getppid);
        local++;
    }
    *n = local;
    return NULL;
}

int main(int argc, char **argv)
{
    long n = atol(argv[1]), per = atol(argv[2]);
    int threads = atoi(argv[3]);
    pthread_t th[16];
    long spun[16] = {0}, ppid = 0;
    struct timespec t0, t1;
    char c;
    if (threads > 16)
        return 2;
    printf("ready\n");
    fflush(stdout);
    if (read(0, &c, 1) != 1)
        return 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, spin, &spun[i]);
    for (long i = 0; i < n; i++) {
        unsigned cpu;
        syscall(SYS_getcpu, &cpu, NULL, NULL);
        for (long j = 0; j < per; j++) {
            syscall(SYS_getppid);
            ppid++;
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        ppid += spun[i];
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("done %ld %ld %ld\n", n, ppid, (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec));
    fflush(stdout);
    while (read(0, &c, 1) > 0)
        ;
    return 0;
}
"""

# Same protocol; makes N clock_nanosleep calls of SLEEP_NS each.
SLEEPER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    long n = atol(argv[1]), ns = atol(argv[2]);
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    char c;
    printf("ready\n");
    fflush(stdout);
    if (read(0, &c, 1) != 1)
        return 1;
    for (long i = 0; i < n; i++)
        clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
    printf("done %ld\n", n);
    fflush(stdout);
    while (read(0, &c, 1) > 0)
        ;
    return 0;
}
"""


class Child:
    """A C child on the ready/go/done protocol; always killed at the end of the test."""

    def __init__(self, binary: Path, *args: int) -> None:
        self.proc = subprocess.Popen([str(binary), *map(str, args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        assert self.line() == "ready"

    def line(self, timeout: float = 60.0) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"child {self.pid} said nothing within {timeout}s")
        return self.proc.stdout.readline().strip()

    def go(self) -> list[int]:
        self.proc.stdin.write("g")
        self.proc.stdin.flush()
        words = self.line().split()
        assert words[0] == "done", words
        return [int(w) for w in words[1:]]

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def children():
    started: list[Child] = []

    def spawn(binary: Path, *args: int) -> Child:
        child = Child(binary, *args)
        started.append(child)
        return child

    yield spawn
    for child in started:
        child.finish()


@pytest.fixture
def probe_factory():
    probes: list[SyscallsProbe] = []

    def make(config: SyscallsConfig | None = None) -> SyscallsProbe:
        probe = SyscallsProbe(config)
        probes.append(probe)
        return probe

    yield make
    for probe in probes:
        probe.stop()


# --- without root: rendering, names, slots -------------------------------------------------


def test_render_defines_latency_only_when_asked():
    plain = render(SyscallsConfig(max_targets=4))
    timed = render(SyscallsConfig(max_targets=4, latency=True))
    assert "#define MAX_TARGETS 4\n" in plain
    assert "#define LATENCY 1" not in plain
    assert "#define LATENCY 1\n" in timed
    assert plain.index("#define") < plain.index("RAW_TRACEPOINT_PROBE(sys_enter)")
    assert "RAW_TRACEPOINT_PROBE(sys_exit)" in timed.split("#ifdef LATENCY", 2)[2]


def test_latency_slots_come_from_the_shared_log2_helper():
    timed = render(SyscallsConfig(latency=True))
    assert c_helpers.log2_slot() in timed
    assert "log2_slot(delta)" in BPF_TEXT and "bpf_log2l" not in BPF_TEXT


@pytest.mark.parametrize("field,value", [("max_targets", 0), ("top_n", 0), ("latency_entries", 0)])
def test_config_rejects_bad_values_quoting_them(field, value):
    with pytest.raises(ValueError, match=f"{field}.*{value}"):
        SyscallsConfig(**{field: value})


def test_names_unknown_numbers_and_the_overflow_slot():
    assert syscall_name(39) == "getpid"
    assert syscall_name(309) == "getcpu"
    assert syscall_name(OTHER_ID) == "syscall_other"
    assert syscall_name(335) == "uretprobe", "the syscall our own GC uretprobe makes the target do"
    unnamed = next(nr for nr in range(OTHER_ID) if nr not in SYSCALL_NAMES and nr > 400)
    assert syscall_name(unnamed) == f"syscall_{unnamed}"


def test_the_x86_64_table_is_never_applied_to_another_architecture():
    # aarch64's 63 is read and 172 getpid; x86-64's 0 is read: a wrong table would name every syscall wrongly.
    assert syscall_name(0, "x86_64") == "read" and syscall_name(0, "aarch64") == "syscall_0"
    assert syscall_name(63, "aarch64") == "syscall_63" and syscall_name(OTHER_ID, "aarch64") == "syscall_other"
    assert SyscallsProbe(machine="x86_64").health().detail["syscall_names"] == "x86_64"
    why = SyscallsProbe(machine="aarch64").health().detail["syscall_names"]
    assert why == "no syscall table shipped for aarch64: syscalls are shown by number (syscall_<nr>)"


def test_name_table_matches_the_uapi_header():
    if not UNISTD.exists():
        pytest.skip(f"{UNISTD} is absent (linux-libc-dev not installed): nothing to compare with")
    header = {int(nr): name for name, nr in re.findall(r"#define __NR_(\w+) (\d+)", UNISTD.read_text())}
    assert SYSCALL_NAMES == header


def test_slots_reuse_the_longest_freed_slot_and_refuse_overflow():
    slots = TargetSlots(2)
    assert slots.add(100) == 0
    assert slots.add(200) == 1
    with pytest.raises(ProbeUnavailable, match="300"):
        slots.add(300)
    slots.remove(100)
    slots.remove(200)
    assert slots.add(300) == 0
    with pytest.raises(ValueError, match="-5"):
        slots.add(-5)


# --- as root, in the real kernel ---------------------------------------------------------


@pytest.mark.bpf
def test_rare_syscall_counted_exactly_under_a_million_syscalls_per_second(require_bpf, cc, children, probe_factory):
    binary = cc(CHILD_C, "sysmix")
    n, per = 100_000, 10
    target = children(binary, n, per, 1)
    bystander = children(binary, n, per, 1)  # same workload, not a target: must not leak in
    probe = probe_factory()
    probe.start([target.pid])
    probe.read()  # discard the child's ready/go handshake syscalls

    bystander.proc.stdin.write("g")
    bystander.proc.stdin.flush()
    getcpu, getppid, elapsed_ns = target.go()
    reading = probe.read()

    assert getcpu == n
    rate = (getcpu + getppid) / (elapsed_ns / 1e9)
    assert rate > 1_000_000, f"child made only {rate:.0f} syscalls/s; the test needs > 1M/s"
    assert reading[target.pid].counts["getcpu"] == n
    assert reading[target.pid].counts["getppid"] == getppid
    assert bystander.pid not in reading
    assert bystander.line().startswith("done")
    assert probe.health().lost_events == 0


@pytest.mark.bpf
def test_targets_change_without_reload_and_windows_do_not_overlap(require_bpf, cc, children, probe_factory):
    binary = cc(CHILD_C, "sysmix2")
    first, second = children(binary, 20_000, 1, 0), children(binary, 30_000, 1, 0)
    probe = probe_factory()
    probe.start([])
    loaded = probe._bpf

    probe.set_targets([first.pid])
    probe.read()
    assert first.go()[0] == 20_000
    window1 = probe.read()
    assert window1[first.pid].counts["getcpu"] == 20_000
    assert probe.read()[first.pid].counts.get("getcpu", 0) == 0  # the read cleared it

    probe.set_targets([second.pid])
    probe.read()
    assert second.go()[0] == 30_000
    window2 = probe.read()
    assert probe._bpf is loaded
    assert set(window2) == {second.pid}
    assert window2[second.pid].counts["getcpu"] == 30_000
    assert probe.health().targets == 1


@pytest.mark.bpf
def test_reused_slot_starts_from_zero(require_bpf, cc, children, probe_factory):
    binary = cc(CHILD_C, "sysmix3")
    first, second = children(binary, 5_000, 0, 0), children(binary, 7_000, 0, 0)
    probe = probe_factory(SyscallsConfig(max_targets=1))
    probe.start([first.pid])
    first.go()
    probe.set_targets([second.pid])  # takes first's only slot, with its unread counts in it
    second.go()
    assert probe.read()[second.pid].counts["getcpu"] == 7_000


@pytest.mark.bpf
def test_exited_target_is_dropped_not_an_error(require_bpf, cc, children, probe_factory):
    binary = cc(CHILD_C, "sysmix4")
    child = children(binary, 1_000, 0, 0)
    probe = probe_factory()
    probe.start([child.pid])
    child.go()
    child.finish()
    assert probe.read() == {}
    assert probe.health().targets == 0
    assert probe.health().state == "running"


@pytest.mark.bpf
def test_latency_mode_times_sleeps_and_every_getppid(require_bpf, cc, children, probe_factory):
    sleeper = children(cc(SLEEPER_C, "sleeper"), 40, 2_000_000)
    mixer = children(cc(CHILD_C, "sysmix5"), 1_000, 20, 0)
    probe = probe_factory(SyscallsConfig(latency=True, top_n=50))
    probe.start([sleeper.pid, mixer.pid])
    probe.read()
    assert sleeper.go() == [40]
    _, getppid, _ = mixer.go()
    reading = probe.read()

    sleeps = reading[sleeper.pid].latency["clock_nanosleep"]
    assert sleeps.unit == "ns"
    assert sleeps.total() == 40
    # 2 ms requested: every sleep lasts at least that, so no sample below slot 20 ([1.05, 2.1) ms).
    assert sum(sleeps.counts[:20]) == 0
    assert sleeps.quantile(0.5) >= 2_000_000
    fast = reading[mixer.pid].latency["getppid"]
    assert fast.total() == getppid == reading[mixer.pid].counts["getppid"]
    assert fast.quantile(0.5) < 1_000_000
    assert probe.health().lost_events == 0


@pytest.mark.bpf
def test_reading_is_a_log2_histogram_per_top_syscall(require_bpf, cc, children, probe_factory):
    child = children(cc(CHILD_C, "sysmix6"), 3_000, 2, 0)
    probe = probe_factory(SyscallsConfig(latency=True, top_n=1))
    probe.start([child.pid])
    probe.read()
    child.go()
    reading = probe.read()[child.pid]
    assert list(reading.latency) == ["getppid"]  # top 1 by count: 6000 getppid vs 3000 getcpu
    hist = reading.latency["getppid"]
    assert isinstance(hist, Log2Histogram) and hist.unit == "ns"
    # One latency sample per counted call: the histogram holds exactly the 6000 getppid.
    assert reading.counts["getppid"] == 6_000 and hist.total() == 6_000


@pytest.mark.bpf
def test_latency_mode_forgets_threads_that_died_in_a_syscall(require_bpf, cc, children, probe_factory):
    child = children(cc(CHILD_C, "sysmix7"), 1_000, 1, 3)  # 3 threads that end in exit(2), which never returns
    probe = probe_factory(SyscallsConfig(latency=True))
    probe.start([child.pid])
    child.go()
    probe.read()
    live = {int(t) for t in os.listdir(f"/proc/{child.pid}/task")}
    tracked = {int(k) for k, _ in probe._bpf[b"start"].items_lookup_batch()}
    assert len(live) == 1
    assert tracked <= live, tracked - live


@pytest.mark.bpf
@pytest.mark.parametrize("buckets", [1, target_filter.TARGET_BUCKETS])
def test_targets_in_one_bucket_spill_and_still_count_exactly(require_bpf, cc, children, probe_factory,
                                                             monkeypatch, buckets):
    """With one bucket every target after the first lives in the spill hash: the same exact counts
    whichever way each target is found, while targets come and go (the home one leaving first)."""
    monkeypatch.setattr(target_filter, "TARGET_BUCKETS", buckets)
    binary = cc(CHILD_C, "spill")
    first, second, third = (children(binary, n, 0, 0) for n in (3_000, 5_000, 7_000))
    bystander = children(binary, 11_000, 0, 0)
    probe = probe_factory()
    probe.start([first.pid, second.pid])
    probe.read()

    assert first.go()[0] == 3_000 and second.go()[0] == 5_000
    bystander.proc.stdin.write("g")
    bystander.proc.stdin.flush()
    assert bystander.line().startswith("done")
    window = probe.read()
    assert {pid: r.counts["getcpu"] for pid, r in window.items()} == {first.pid: 3_000, second.pid: 5_000}

    probe.set_targets([second.pid, third.pid])  # the bucket's home target leaves, a spilled one stays
    probe.read()
    assert third.go()[0] == 7_000
    window = probe.read()
    assert set(window) == {second.pid, third.pid}
    assert window[third.pid].counts["getcpu"] == 7_000
    assert window[second.pid].counts.get("getcpu", 0) == 0
    assert probe.health().lost_events == 0
