"""An independent reading of one process's threads from /proc, once a second: the load test's ground truth.

Why it exists: `infersight loadtest` names a bottleneck ("CPU of the busiest thread", "CPU contention
(run queue)", ...) from figures the agent collects. To check that verdict, something that shares none of
the agent's code has to read the same resources another way. This module is that reading: it imports
nothing of ours (no agent, no psutil, no BPF), only the kernel's per-thread counters:

- `/proc/PID/task/TID/stat`, fields 14-15: user + system CPU ticks of each thread;
- `/proc/PID/task/TID/schedstat`, field 2: nanoseconds the thread waited runnable in a run queue;
- `/proc/PID/task/TID/status`: voluntary and involuntary context switches.

Per second it prints and writes one CSV row: the process's CPU (cores), the busiest thread's CPU share
(a decode loop near 1.0 core is saturated: one Python thread cannot use more), that thread's and the
whole process's run-queue wait per second, context switches per second, and the load average. With
`--tid` (the bundled server's scheduler thread, from `/admin/debug`) it also reports that thread.

    python -m benchmarks.proc_threads PID --csv out.csv [--tid TID] [--interval 1]

It stops when the process exits or on SIGTERM/SIGINT. Threads that exit between two readings drop out
of the per-thread sums for that second (the process CPU comes from `/proc/PID/stat`, which keeps them).
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TextIO

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK")
# As the load test's run-queue figure: an idle process's tiny CPU must not inflate the wait per CPU second.
CPU_FLOOR = 0.05


@dataclass(frozen=True)
class ThreadSample:
    cpu_s: float  # user + system, seconds since the thread started
    run_delay_s: float  # waited runnable in a run queue, seconds since the thread started
    voluntary: int
    involuntary: int


def parse_stat_cpu(text: str, tick: int = TICK) -> float:
    """utime + stime of a /proc stat line, in seconds. Field 2 (comm) may hold spaces and ')'."""
    rest = text.rsplit(")", 1)[1].split()  # rest[0] is field 3 (state), so utime/stime are rest[11]/rest[12]
    return (int(rest[11]) + int(rest[12])) / tick


def parse_schedstat(text: str) -> float:
    """Run delay of a schedstat line ("on-cpu-ns run-delay-ns timeslices"), in seconds."""
    return int(text.split()[1]) / 1e9


def parse_switches(text: str) -> tuple[int, int]:
    """(voluntary, involuntary) context switches from a /proc status file."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            found[key] = int(value)
    return found.get("voluntary_ctxt_switches", 0), found.get("nonvoluntary_ctxt_switches", 0)


def read_threads(pid: int, proc: Path = PROC, tick: int = TICK) -> dict[int, ThreadSample]:
    """Every thread of `pid` now; a thread that exits while being read is left out. FileNotFoundError if the
    process is gone."""
    out: dict[int, ThreadSample] = {}
    for name in os.listdir(proc / str(pid) / "task"):
        task = proc / str(pid) / "task" / name
        try:
            sample = ThreadSample(parse_stat_cpu((task / "stat").read_text(), tick),
                                  parse_schedstat((task / "schedstat").read_text()),
                                  *parse_switches((task / "status").read_text()))
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(name)] = sample
    return out


def read_process_cpu(pid: int, proc: Path = PROC, tick: int = TICK) -> float:
    """CPU seconds of the whole process, its exited threads included. ProcessLookupError once it has exited
    (a zombie not yet reaped still has its /proc entry)."""
    text = (proc / str(pid) / "stat").read_text()
    if text.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
        raise ProcessLookupError(f"pid {pid} has exited")
    return parse_stat_cpu(text, tick)


@dataclass(frozen=True)
class Row:
    t: float  # unix time of the second reading
    threads: int
    process_cores: float
    top_tid: int
    top_cores: float  # the busiest thread's CPU share this second
    top_runq_s_per_s: float  # ... and how long it waited in a run queue per second
    runq_s_per_s: float  # every thread's run-queue wait per second
    runq_per_cpu_s: float  # that wait per CPU second the process used (>= 1: waits as long as it runs)
    ctxsw_per_s: float
    invol_ctxsw_per_s: float
    tid_cores: float | None  # the thread named with --tid, if any
    tid_runq_s_per_s: float | None
    load1: float


def row(before: dict[int, ThreadSample], after: dict[int, ThreadSample], cpu_before: float, cpu_after: float,
        dt: float, t: float, load1: float, tid: int | None = None) -> Row:
    """One second's figures from two readings `dt` seconds apart. A thread new in `after` counts from zero."""
    zero = ThreadSample(0.0, 0.0, 0, 0)

    def delta(name: str, k: int) -> float:
        return getattr(after[k], name) - getattr(before.get(k, zero), name)

    cpu = {k: delta("cpu_s", k) / dt for k in after}
    top = max(cpu, key=lambda k: cpu[k]) if cpu else 0
    runq = sum(delta("run_delay_s", k) for k in after) / dt
    process_cores = (cpu_after - cpu_before) / dt
    return Row(t=t, threads=len(after), process_cores=process_cores, top_tid=top, top_cores=cpu.get(top, 0.0),
               top_runq_s_per_s=delta("run_delay_s", top) / dt if cpu else 0.0,
               runq_s_per_s=runq, runq_per_cpu_s=runq / max(process_cores, CPU_FLOOR),
               ctxsw_per_s=sum(delta("voluntary", k) + delta("involuntary", k) for k in after) / dt,
               invol_ctxsw_per_s=sum(delta("involuntary", k) for k in after) / dt,
               tid_cores=cpu.get(tid) if tid is not None and tid in after else None,
               tid_runq_s_per_s=delta("run_delay_s", tid) / dt if tid is not None and tid in after else None,
               load1=load1)


def _fmt(v: object) -> str:
    if v is None:
        return ""
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def watch(pid: int, csv_path: Path | None, interval: float = 1.0, tid: int | None = None,
          out: TextIO = sys.stdout, proc: Path = PROC, stop: threading.Event | None = None) -> int:
    """Read every `interval` seconds until the process exits or `stop` is set; returns the rows written."""
    stop = stop or threading.Event()
    names = [f.name for f in fields(Row)]
    handle = csv_path.open("w", newline="") if csv_path else None
    writer = csv.writer(handle) if handle else None
    if writer:
        writer.writerow(names)
    rows = 0
    try:
        prev, prev_cpu, prev_t = read_threads(pid, proc), read_process_cpu(pid, proc), time.monotonic()
        while not stop.wait(interval):
            try:
                cur, cur_cpu = read_threads(pid, proc), read_process_cpu(pid, proc)
            except (FileNotFoundError, ProcessLookupError):
                break
            now = time.monotonic()
            r = row(prev, cur, prev_cpu, cur_cpu, now - prev_t, time.time(), os.getloadavg()[0], tid)
            values = asdict(r)
            if writer and handle:
                writer.writerow([_fmt(values[n]) for n in names])
                handle.flush()
            extra = "" if r.tid_cores is None else f" tid{tid}={r.tid_cores:.2f} (runq {r.tid_runq_s_per_s:.2f} s/s)"
            print(f"{r.t:.0f} proc={r.process_cores:.2f} cores top=tid{r.top_tid} {r.top_cores:.2f} cores "
                  f"(runq {r.top_runq_s_per_s:.2f} s/s) runq={r.runq_s_per_s:.2f} s/s "
                  f"({r.runq_per_cpu_s:.2f} per CPU s) ctxsw={r.ctxsw_per_s:.0f}/s "
                  f"invol={r.invol_ctxsw_per_s:.0f}/s{extra} load1={r.load1:.1f}", file=out, flush=True)
            rows += 1
            prev, prev_cpu, prev_t = cur, cur_cpu, now
    except (FileNotFoundError, ProcessLookupError):
        pass  # gone before the first reading
    finally:
        if handle:
            handle.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.proc_threads", description=__doc__.splitlines()[0])
    p.add_argument("pid", type=int)
    p.add_argument("--csv", type=Path, help="write one row per reading here")
    p.add_argument("--tid", type=int, help="also report this thread (e.g. the server's scheduler thread)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between readings (default 1)")
    args = p.parse_args(argv)
    if not (PROC / str(args.pid) / "task").is_dir():
        print(f"proc_threads: no process {args.pid}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    watch(args.pid, args.csv, args.interval, args.tid, stop=stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
