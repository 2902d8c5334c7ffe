"""Probe overhead benchmark: getppid, pipe ping-pong and gc.collect loops, A/B interleaved: no probe vs ours vs bcc's tools.

Run as root from the repository root (a few minutes; see docs/BENCHMARKS.md):

    .venv/bin/python tests/probes/bench_probes.py --rounds 12 --json /tmp/bench_probes.json

Every round runs, for each condition in a shuffled order, one *pair* of blocks: the
micro-workloads with no probe and with the condition (attached once: our probe class
started, or bcc's tool launched as a subprocess and waited for until it has attached), in a
random order within the pair. A block is `--runs` runs of each workload; it counts its
median run. The cost of a condition is the per-pair difference (probe - none), so that slow
drifts of a shared host cancel; the report gives the median and the spread (p25..p75 and
min..max) over pairs.

Workloads (all pinned to one CPU, so the ping-pong is pure context switches):
  getppid   N calls of syscall(SYS_getppid); ns per call; 1 syscall per op.
  getppid2  the same, timed while a second target process loops getppid on the other CPU(s):
            shows what sharing one hash entry across CPUs (syscount) costs next to per-CPU counts.
  pingpong  N round trips of one byte over two pipes between two processes; ns per round
            trip; 4 syscalls (write+read on each side), 2 context switches and 2 wakeups per op.
  gccollect N calls of gc.collect(0) in a Python child (this interpreter, automatic GC off); ns
            per collection; 1 collection, no syscall per op: what the gcpause uprobes cost.
Each run is timed in chunks (2,000 calls, 100 round trips, 500 collections) and reports a low quantile of
its chunks (p10 by default): chunks in which another task took the CPU, or loaded its
hyperthread sibling, fall out; what remains is the cost of the code path itself.

Not collected by pytest (the name does not start with test_).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from probes.gcpause import GcPauseProbe
from probes.offcpu import OffCpuProbe
from probes.runqlat import RunqlatConfig, RunqlatProbe
from probes.syscalls import SyscallsConfig, SyscallsProbe
from probes.tcpretrans import TcpRetransProbe

WORKLOAD_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

// argv: mode ops-per-run cpu ops-per-chunk percentile. Prints "ready PID CHILD", then one
// line per 'g' read on stdin: the given percentile of the run's per-chunk ns per op.
int main(int argc, char **argv)
{
    const char *mode = argv[1];
    long n = atol(argv[2]), chunk = atol(argv[4]), pct = atol(argv[5]), chunks = n / chunk;
    cpu_set_t set;
    int a[2], b[2];
    pid_t child = 0;
    char c = 'x';
    double *per_op = calloc(chunks, sizeof *per_op);
    CPU_ZERO(&set);
    CPU_SET(atoi(argv[3]), &set);
    if (sched_setaffinity(0, sizeof set, &set))
        return 3;
    int pingpong = strcmp(mode, "pingpong") == 0, parallel = strcmp(mode, "getppid2") == 0;
    // getppid2: a second process loops getppid on the other CPUs while this one is timed.
    volatile int *busy = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (parallel) {
        if (pipe(a))
            return 4;
        child = fork();
        if (child == 0) {
            cpu_set_t others;
            CPU_ZERO(&others);
            for (int i = 0; i < CPU_SETSIZE; i++)
                if (i != atoi(argv[3]))
                    CPU_SET(i, &others);
            sched_setaffinity(0, sizeof others, &others);
            close(a[1]);
            while (read(a[0], &c, 1) == 1) {
                while (*busy)
                    syscall(SYS_getppid);
            }
            _exit(0);
        }
        close(a[0]);
    }
    if (pingpong) {
        if (pipe(a) || pipe(b))
            return 4;
        child = fork();
        if (child == 0) {
            close(a[1]);
            while (read(a[0], &c, 1) == 1) {
                if (write(b[1], &c, 1) != 1)
                    _exit(5);
            }
            _exit(0);
        }
        close(a[0]);
    }
    printf("ready %d %d\n", getpid(), (int)child);
    fflush(stdout);
    while (read(0, &c, 1) == 1 && c == 'g') {
        if (parallel) {
            *busy = 1;
            if (write(a[1], &c, 1) != 1)
                return 7;
        }
        // Timed in chunks; a low percentile drops the ones another task disturbed.
        for (long k = 0; k < chunks; k++) {
            long t0 = now_ns();
            if (pingpong) {
                for (long i = 0; i < chunk; i++) {
                    if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1)
                        return 6;
                }
            } else {
                for (long i = 0; i < chunk; i++)
                    syscall(SYS_getppid);
            }
            per_op[k] = (double)(now_ns() - t0) / chunk;
        }
        *busy = 0;
        qsort(per_op, chunks, sizeof *per_op, cmp_double);
        printf("%.3f\n", per_op[chunks * pct / 100]);
        fflush(stdout);
    }
    if (child) {
        close(a[1]);
        waitpid(child, NULL, 0);
    }
    return 0;
}
"""

# The same protocol as WORKLOAD_C (argv after the script: mode ops-per-run cpu ops-per-chunk percentile), after
# the name of the `time` clock it times with: perf_counter_ns (wall) or thread_time_ns (its own CPU time, which
# includes the kernel's uprobe handling in its context and which other tasks taking the CPU do not inflate).
GC_WORKLOAD_PY = r"""
import gc, os, sys, time
_, clock_name, mode, n, cpu, chunk, pct = sys.argv
n, chunk, pct = int(n), int(chunk), int(pct)
chunks = n // chunk
os.sched_setaffinity(0, {int(cpu)})
gc.disable()  # only the loop's own collections run, one per op
collect, clock = gc.collect, getattr(time, clock_name)
per_op = [0.0] * chunks
print(f"ready {os.getpid()} 0", flush=True)
while sys.stdin.buffer.read(1) == b"g":
    for k in range(chunks):
        t0 = clock()
        for _ in range(chunk):
            collect(0)
        per_op[k] = (clock() - t0) / chunk
    print(f"{sorted(per_op)[chunks * pct // 100]:.3f}", flush=True)
"""

WORKLOADS = ("getppid", "getppid2", "pingpong", "gccollect")
# Events per op for "ns added per event", by the kind of event a condition pays per: syscalls,
# context switches (runqlat, offcpu), GC collections (gcpause), TCP retransmits (none here).
# Absent: the workload has none of that event.
EVENTS_PER_OP = {
    ("getppid", "syscall"): 1, ("getppid2", "syscall"): 1, ("pingpong", "syscall"): 4,
    ("pingpong", "sched"): 2, ("gccollect", "gc"): 1,
}
EVENT_NAMES = {"syscall": "syscall", "sched": "switch", "gc": "collection", "tcp": "retransmit"}

Pids = dict[str, list[int]]  # workload -> its pids


@dataclass
class Condition:
    name: str
    kind: str  # a key of EVENT_NAMES: which events it pays per
    attach: Callable[[Pids], Callable[[], None]]  # pids of the workloads -> detach


@dataclass
class Result:
    condition: str
    workload: str
    none_ns: list[float] = field(default_factory=list)
    probe_ns: list[float] = field(default_factory=list)


class Workload:
    """One micro-workload process (two for pingpong), stopped at 'ready' until go()."""

    def __init__(self, command: list[str], mode: str, n: int, chunk: int, cpu: int, quantile: int = 10) -> None:
        if n % chunk:
            raise ValueError(f"{mode}: {n} ops is not a multiple of the chunk size {chunk}")
        self.proc = subprocess.Popen([*command, mode, str(n), str(cpu), str(chunk), str(quantile)],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        words = _line(self.proc, 30).split()
        if words[0] != "ready":
            raise RuntimeError(f"workload {mode} said {words!r} instead of 'ready'")
        self.pids = [int(w) for w in words[1:] if int(w) > 0]

    def go(self) -> float:
        self.proc.stdin.write("g")
        self.proc.stdin.flush()
        return float(_line(self.proc, 120))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _line(proc: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError(f"process {proc.pid} said nothing within {timeout}s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"process {proc.pid} closed its output (exit {proc.poll()})")
    return line.strip()


def start_workloads(binary: Path, args: argparse.Namespace) -> dict[str, Workload]:
    sizes = {"getppid": (args.calls, args.chunk_calls), "getppid2": (args.calls, args.chunk_calls),
             "pingpong": (args.round_trips, args.chunk_round_trips),
             "gccollect": (args.collections, args.chunk_collections)}
    clock = {"wall": "perf_counter_ns", "cpu": "thread_time_ns"}[args.gc_clock]
    commands = {w: [str(binary)] for w in WORKLOADS} | {"gccollect": [sys.executable, "-c", GC_WORKLOAD_PY, clock]}
    return {w: Workload(commands[w], w, *sizes[w], args.cpu, args.chunk_quantile) for w in WORKLOADS}


def _pids_of(pids: Pids, workloads: tuple[str, ...]) -> list[int]:
    return [pid for w in workloads for pid in pids[w]]


def _ours(factory: Callable[[], object], target: bool, workloads: tuple[str, ...] = WORKLOADS
          ) -> Callable[[Pids], Callable[[], None]]:
    def attach(pids: Pids) -> Callable[[], None]:
        probe = factory()
        # Non-target: the probe watches this (idle) harness, so the workload only pays the filter.
        probe.start(_pids_of(pids, workloads) if target else [os.getpid()])
        return probe.stop

    return attach


def _bcc_tool(argv: list[str], ready_text: str) -> Callable[[Pids], Callable[[], None]]:
    def attach(pids: Pids) -> Callable[[], None]:
        tool = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        # The tools print their banner after BPF() has loaded and attached every program.
        while ready_text not in _line(tool, max(1.0, deadline - time.monotonic())):
            pass

        def detach() -> None:
            tool.send_signal(signal.SIGINT)
            try:
                tool.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                tool.kill()
                tool.communicate()

        return detach

    return attach


def conditions() -> list[Condition]:
    return [
        Condition("ours syscalls count (target)", "syscall", _ours(lambda: SyscallsProbe(), True)),
        Condition("ours syscalls count (non-target)", "syscall", _ours(lambda: SyscallsProbe(), False)),
        Condition("ours syscalls +latency (target)", "syscall",
                  _ours(lambda: SyscallsProbe(SyscallsConfig(latency=True)), True)),
        Condition("ours syscalls +latency (non-target)", "syscall",
                  _ours(lambda: SyscallsProbe(SyscallsConfig(latency=True)), False)),
        Condition("syscount-bpfcc (all pids)", "syscall", _bcc_tool(["syscount-bpfcc"], "Tracing syscalls")),
        Condition("ours runqlat (target)", "sched", _ours(lambda: RunqlatProbe(), True)),
        Condition("ours runqlat (non-target)", "sched", _ours(lambda: RunqlatProbe(), False)),
        Condition("runqlat-bpfcc (all pids)", "sched", _bcc_tool(["runqlat-bpfcc"], "Tracing run queue latency")),
        Condition("ours offcpu (target)", "sched", _ours(lambda: OffCpuProbe(), True)),
        Condition("ours offcpu (non-target)", "sched", _ours(lambda: OffCpuProbe(), False)),
        # No tgid filter in the kernel (retransmits run in softirq context): one host-wide condition.
        Condition("ours tcpretrans (host-wide)", "tcp", _ours(lambda: TcpRetransProbe(), True)),
        # Uprobes are placed in the target's libpython only; the C workloads cannot be targets.
        Condition("ours gcpause (target)", "gc", _ours(lambda: GcPauseProbe(), True, ("gccollect",))),
        Condition("ours gcpause (non-target)", "gc", _ours(lambda: GcPauseProbe(), False)),
    ]


def run_block(binary: Path, args: argparse.Namespace, attach: Callable[[Pids], Callable[[], None]] | None
              ) -> dict[str, float]:
    """`args.runs` runs of each workload under one attachment of the condition (None = no probe).

    Returns the median run per workload, in ns per op.
    """
    loads = start_workloads(binary, args)
    detach = None
    try:
        if attach is not None:
            detach = attach({w: load.pids for w, load in loads.items()})
        runs: dict[str, list[float]] = {w: [] for w in WORKLOADS}
        for _ in range(args.runs):
            for w in WORKLOADS:
                runs[w].append(loads[w].go())
        return {w: statistics.median(v) for w, v in runs.items()}
    finally:
        if detach is not None:
            detach()
        for w in loads.values():
            w.kill()


class Switch:
    """One loaded BCC object whose tracepoints are attached and detached without recompiling."""

    def __init__(self, bpf: object) -> None:
        self.bpf = bpf
        self.raw = list(bpf.raw_tracepoint_fds)
        self.classic = list(bpf.tracepoint_fds)
        self.attached = True

    def set(self, on: bool) -> None:
        if on == self.attached:
            return
        for tp in self.raw:
            if on:
                self.bpf.attach_raw_tracepoint(tp=tp, fn_name=b"raw_tracepoint__" + tp)
            else:
                self.bpf.detach_raw_tracepoint(tp=tp)
        for tp in self.classic:
            if on:
                self.bpf.attach_tracepoint(tp=tp, fn_name=b"tracepoint__" + tp.replace(b":", b"__"))
            else:
                self.bpf.detach_tracepoint(tp=tp)
        self.attached = on


class TargetSwitch:
    """A started probe whose attachment is its target set: gcpause's uprobes exist per target pid,
    so set_targets() attaches and detaches the already loaded functions (no recompile)."""

    def __init__(self, probe: GcPauseProbe, targets: list[int]) -> None:
        self.probe = probe
        self.targets = targets
        self.attached = True

    def set(self, on: bool) -> None:
        if on != self.attached:
            self.probe.set_targets(self.targets if on else [])
            self.attached = on


class FollowSwitch:
    """gcpause with its targets followed (a family's members): on, the targets' image has system-wide uprobes
    (pid -1), which every process running that file pays, the in-kernel filter leaving out the non-targets;
    off, no uprobes at all."""

    def __init__(self, probe: GcPauseProbe, targets: list[int]) -> None:
        self.probe = probe
        self.targets = targets
        self.attached = True

    def set(self, on: bool) -> None:
        if on == self.attached:
            return
        if on:
            self.probe.set_targets(self.targets)
            self.probe.set_followed(self.targets)
        else:
            self.probe.set_followed([])
            self.probe.set_targets([])
        # The uprobes a switch leaves attached (per-pid ones moved from, shared sets no longer used) go at the next
        # read, as in the agent, where a read comes every window: here at once, or they would be timed too.
        self.probe.read()
        self.attached = on


def _tool_text(tool: str) -> str:
    """The C text bcc's tool itself would load (its --ebpf output), for in-process toggling."""
    return subprocess.run([tool, "--ebpf"], capture_output=True, text=True, check=True).stdout


class _PreFamilySyscalls(SyscallsProbe):
    def _render(self) -> str:
        return "#define NO_FAMILY_LOOKUP 1\n" + super()._render()


class _ChildWaitingSyscalls(SyscallsProbe):
    def start(self, targets) -> None:
        super().start(targets)
        waiting = self._bpf[b"newborns"]
        waiting[waiting.Key(0)] = waiting.Leaf(1)


CGROUP_FILTER_C = r"""
BPF_HASH(cgroups, u64, u32, 64);
BPF_PERCPU_ARRAY(counts, u64, 64 * 512);
RAW_TRACEPOINT_PROBE(sys_enter)
{
    u64 id = bpf_get_current_cgroup_id();
    u32 *slot = cgroups.lookup(&id);
    if (!slot)
        return 0;
    u32 idx = *slot * 512 + (ctx->args[1] & 511);
    u64 *n = counts.lookup(&idx);
    if (n)
        (*n)++;
    return 0;
}
"""


def toggle_switches(pids: Pids) -> tuple[dict[str, Switch | TargetSwitch | FollowSwitch], list[Callable[[], None]],
                                       dict[str, str]]:
    from probes.base import load_bpf

    switches: dict[str, Switch | TargetSwitch | FollowSwitch] = {}
    cleanups: list[Callable[[], None]] = []
    kinds: dict[str, str] = {}
    ours = [("ours syscalls count", "syscall", lambda: SyscallsProbe()),
            # The same probe with the filter as it was before families (no newborn check): its side-by-side cost.
            ("ours syscalls count, pre-family filter", "syscall", lambda: _PreFamilySyscalls()),
            # Every miss pays the newborn hash: the filter while a followed child waits to be adopted (<= 1 window).
            ("ours syscalls count, a child waiting", "syscall", lambda: _ChildWaitingSyscalls()),
            ("ours syscalls +latency", "syscall", lambda: SyscallsProbe(SyscallsConfig(latency=True))),
            ("ours runqlat", "sched", lambda: RunqlatProbe()),
            # The probe as it was before it named culprits (issue 34): histogram and total only.
            ("ours runqlat, no culprits", "sched", lambda: RunqlatProbe(RunqlatConfig(culprits=False))),
            ("ours offcpu", "sched", lambda: OffCpuProbe())]
    for name, kind, factory in ours:
        for target in (True, False):
            probe = factory()
            probe.start(_pids_of(pids, WORKLOADS) if target else [os.getpid()])
            cleanups.append(probe.stop)
            label = f"{name} ({'target' if target else 'non-target'})"
            # The probe's own loaded program: toggling it leaves maps and targets as start() set them.
            switches[label], kinds[label] = Switch(probe._bpf), kind
    tcp = TcpRetransProbe()
    tcp.start([os.getpid()])  # targets only steer attribution in user space
    cleanups.append(tcp.stop)
    switches["ours tcpretrans (host-wide)"], kinds["ours tcpretrans (host-wide)"] = Switch(tcp._bpf), "tcp"
    for target in (True, False):
        gc_targets = pids["gccollect"] if target else [os.getpid()]
        gc_probe = GcPauseProbe()
        gc_probe.start(gc_targets)
        cleanups.append(gc_probe.stop)
        label = f"ours gcpause ({'target' if target else 'non-target'})"
        switches[label], kinds[label] = TargetSwitch(gc_probe, gc_targets), "gc"
        # Followed (a family): the non-target is the gccollect child, running the harness's libpython file.
        followed = GcPauseProbe()
        followed.start(gc_targets)
        followed.set_followed(gc_targets)
        cleanups.append(followed.stop)
        label = f"ours gcpause followed ({'target' if target else 'non-target'})"
        switches[label], kinds[label] = FollowSwitch(followed, gc_targets), "gc"
    for tool, kind in (("syscount-bpfcc", "syscall"), ("runqlat-bpfcc", "sched")):
        bpf = load_bpf(_tool_text(tool))
        cleanups.append(bpf.cleanup)
        label = f"{tool} program (all pids)"
        switches[label], kinds[label] = Switch(bpf), kind
    # Floors: what merely having a program on the hook costs (the syscall slow path, the dispatch).
    for label, text in (("floor: empty raw_tp sys_enter", "RAW_TRACEPOINT_PROBE(sys_enter) { return 0; }"),
                        ("floor: empty tracepoint sys_exit", "TRACEPOINT_PROBE(raw_syscalls, sys_exit) { return 0; }")):
        bpf = load_bpf(text)
        cleanups.append(bpf.cleanup)
        switches[label], kinds[label] = Switch(bpf), "syscall"
    # The cgroup-id filter issue 31 asked to compare with the tgid array: bpf_get_current_cgroup_id() and a hash
    # lookup per syscall, then the same per-slot count as ours. Non-target: the map holds another cgroup's id.
    bpf = load_bpf(CGROUP_FILTER_C)
    cleanups.append(bpf.cleanup)
    cgroups = bpf[b"cgroups"]
    cgroups[cgroups.Key(1)] = cgroups.Leaf(0)
    switches["cgroup-id filter count (non-target)"], kinds["cgroup-id filter count (non-target)"] = Switch(bpf), "syscall"
    for sw in switches.values():
        sw.set(False)
    return switches, cleanups, kinds


def run_toggle(binary: Path, args: argparse.Namespace, rng: random.Random,
               results: dict[tuple[str, str], Result]) -> dict[str, str]:
    """Many short adjacent A/B pairs on long-lived workloads, programs loaded once and toggled."""
    loads = start_workloads(binary, args)
    cleanups: list[Callable[[], None]] = []
    try:
        switches, cleanups, kinds = toggle_switches({w: load.pids for w, load in loads.items()})
        for w in loads.values():
            w.go()  # warm-up
        names = [n for n in switches if not args.only or any(o in n for o in args.only)]
        for rnd in range(args.rounds):
            for name in rng.sample(names, len(names)):
                pair: dict[bool, dict[str, float]] = {}
                for on in rng.sample([False, True], 2):
                    switches[name].set(on)
                    pair[on] = {w: loads[w].go() for w in WORKLOADS}
                    switches[name].set(False)
                for w in WORKLOADS:
                    r = results.setdefault((name, w), Result(name, w))
                    r.none_ns.append(pair[False][w])
                    r.probe_ns.append(pair[True][w])
            if (rnd + 1) % 10 == 0:
                print(f"round {rnd + 1}/{args.rounds}", file=sys.stderr, flush=True)
        return kinds
    finally:
        for cleanup in cleanups:
            cleanup()
        for w in loads.values():
            w.kill()


def summarize(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": statistics.median(values), "p25": q[0], "p75": q[2], "min": min(values), "max": max(values)}


def report(results: dict[tuple[str, str], Result], kinds: dict[str, str]) -> tuple[str, dict]:
    lines = [
        "| condition | workload | none ns/op (median) | with probe ns/op (median) | added ns/op: median [p25..p75] (min..max) | ratio | added ns per event |",
        "|---|---|---|---|---|---|---|",
    ]
    summary: dict[str, dict] = {}
    for (cond, workload), r in results.items():
        deltas = [p - n for p, n in zip(r.probe_ns, r.none_ns)]
        d = summarize(deltas)
        none_med, probe_med = statistics.median(r.none_ns), statistics.median(r.probe_ns)
        per = EVENTS_PER_OP.get((workload, kinds[cond]))
        per_event = f"{d['median'] / per:.0f} ({EVENT_NAMES[kinds[cond]]})" if per else "n/a"
        lines.append(f"| {cond} | {workload} | {none_med:.0f} | {probe_med:.0f} | {d['median']:.0f} "
                     f"[{d['p25']:.0f}..{d['p75']:.0f}] ({d['min']:.0f}..{d['max']:.0f}) | "
                     f"{probe_med / none_med:.2f} | {per_event} |")
        summary[f"{cond} / {workload}"] = {"added_ns": d, "none_median_ns": none_med, "probe_median_ns": probe_med,
                                           "ratio": probe_med / none_med, "pairs": len(deltas)}
    return "\n".join(lines), summary


def run_blocks(binary: Path, args: argparse.Namespace, rng: random.Random, conds: list[Condition],
               results: dict[tuple[str, str], Result], started: float) -> None:
    """Pairs of blocks: no probe vs the condition attached for a whole block (bcc's tools as subprocesses)."""
    run_block(binary, args, None)  # warm-up: page cache, CPU frequency
    for rnd in range(args.rounds):
        for cond in rng.sample(conds, len(conds)):
            order = [None, cond.attach] if rng.random() < 0.5 else [cond.attach, None]
            pair = {id(a): run_block(binary, args, a) for a in order}
            none, probe = pair[id(None)], pair[id(cond.attach)]
            for w in WORKLOADS:
                r = results.setdefault((cond.name, w), Result(cond.name, w))
                r.none_ns.append(none[w])
                r.probe_ns.append(probe[w])
        print(f"round {rnd + 1}/{args.rounds} done at {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="pairs per condition")
    parser.add_argument("--runs", type=int, default=5, help="runs of each workload per attachment (block)")
    parser.add_argument("--calls", type=int, default=200_000, help="getppid calls per run")
    parser.add_argument("--round-trips", type=int, default=5_000, help="ping-pong round trips per run")
    parser.add_argument("--collections", type=int, default=20_000, help="gc.collect(0) calls per run")
    parser.add_argument("--chunk-calls", type=int, default=2_000, help="getppid calls per timed chunk")
    parser.add_argument("--chunk-round-trips", type=int, default=100, help="round trips per timed chunk")
    parser.add_argument("--chunk-collections", type=int, default=500, help="gc.collect(0) calls per timed chunk")
    parser.add_argument("--gc-clock", choices=("wall", "cpu"), default="wall",
                        help="what gccollect times a chunk with: wall time, or the child's own CPU time")
    parser.add_argument("--chunk-quantile", type=int, default=10, help="percentile of chunk times a run reports")
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)), help="CPU the workloads run on")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", default=[], help="run only conditions containing this text (repeatable)")
    parser.add_argument("--mode", choices=("blocks", "toggle"), default="blocks",
                        help="blocks: attach per block, bcc's tools as subprocesses; toggle: load every "
                             "program once (bcc's via the tools' --ebpf text) and flip attachment per run")
    parser.add_argument("--json", type=Path, help="write raw samples and the summary here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root: it loads BPF programs")
    rng = random.Random(args.seed)
    conds = [c for c in conditions() if not args.only or any(o in c.name for o in args.only)]
    kinds = {c.name: c.kind for c in conds}
    results: dict[tuple[str, str], Result] = {}
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "micro"
        subprocess.run(["gcc", "-O2", "-o", str(binary), "-x", "c", "-"], input=WORKLOAD_C, text=True, check=True)
        if args.mode == "toggle":
            kinds = run_toggle(binary, args, rng, results)
        else:
            run_blocks(binary, args, rng, conds, results, started)
    table, summary = report(results, kinds)
    header = (f"mode={args.mode} rounds={args.rounds} runs={args.runs} calls={args.calls} round_trips={args.round_trips} "
              f"collections={args.collections} gc_clock={args.gc_clock} cpu={args.cpu} "
              f"chunk_quantile=p{args.chunk_quantile} "
              f"seed={args.seed} took={time.monotonic() - started:.0f}s "
              f"loadavg before={load_before[0]:.2f} after={os.getloadavg()[0]:.2f}")
    print(header)
    print(table)
    theirs_name = "syscount-bpfcc program (all pids)" if args.mode == "toggle" else "syscount-bpfcc (all pids)"
    ours, theirs = (summary.get(f"{n} / getppid") for n in ("ours syscalls count (target)", theirs_name))
    if ours and theirs:
        verdict = ours["added_ns"]["median"] <= 0.5 * theirs["added_ns"]["median"]
        print(f"\ngoal (ours count-only adds <= half of syscount-bpfcc per getppid): "
              f"{ours['added_ns']['median']:.0f} ns vs {theirs['added_ns']['median']:.0f} ns -> "
              f"{'MET' if verdict else 'NOT MET'}")
    if args.json:
        args.json.write_text(json.dumps({"header": header, "summary": summary,
                                         "samples": [asdict(r) for r in results.values()]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
