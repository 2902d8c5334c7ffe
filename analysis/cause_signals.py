"""The per-cause signals attribution compares to the baseline: how each is read from Features, its floors and units."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from analysis.features import Features

# Kernel wait kinds that mean "waiting on something other than another thread or the network".
BLOCKED_KINDS = ("sleep", "blockio", "stopped", "other")


@dataclass(frozen=True)
class Signal:
    """One cause signal. floor: smallest baseline used as a ratio's denominator; min_change: smallest absolute
    rise that counts; scale: multiplier to the display unit."""

    name: str
    label: str
    what: str
    read: Callable[[Features], float | None]
    floor: float
    min_change: float
    unit: str
    scale: float = 1.0
    source: str = ""
    # Heavy-tailed in healthy windows (0 in many, large in some): judged from its baseline's high quantile, with the
    # distance to it as its spread, not from the median and MAD-sigma (see tail_center, tail_sigma).
    tail: bool = False
    # A count of events per sampling tick (py-spy's idle waits per tick): read from a recording of a few ticks, its
    # sampling noise is judged too, against the baseline's rate at the ticks it was read from (analysis.sampling).
    per_tick: bool = False
    # Read at one instant, the window's end (threads stopped or in disk sleep): a wait caught there is still under way
    # as the next window begins, and the requests it holds up finish, and count their latency, in that next window.
    instant: bool = False


def tail_center(sig: Signal, median: float, high: float | None) -> float:
    """Where a move of `sig` is measured from: the baseline's median, or for a heavy-tailed signal its high quantile."""
    return max(median, high) if sig.tail and high is not None else median


def tail_sigma(sig: Signal, median: float, sigma: float, high: float | None) -> float:
    """The spread a move of `sig` is judged by: the MAD-sigma, or for a heavy-tailed signal at least the distance from
    its median to its high quantile in sigmas of a normal (1.28 to the 90th percentile): a wait that is 0 in half
    the windows and large in the rest has a MAD of 0."""
    return max(sigma, (high - median) / 1.2816) if sig.tail and high is not None else sigma


def _blocked(f: Features) -> float | None:
    return None if f.offcpu is None else sum(f.offcpu[k] for k in BLOCKED_KINDS)


def _futex(f: Features) -> float | None:
    return None if f.offcpu is None else f.offcpu["futex"]


def _runq_per_cpu(f: Features) -> float | None:
    # Waiting for a CPU per second of CPU used: a busier server waits more in proportion, a hogged one far more.
    if f.runqueue_per_second is None or f.cpu_per_second is None:
        return None
    return f.runqueue_per_second / max(f.cpu_per_second, 0.01)


def _involuntary_per_cpu(f: Features) -> float | None:
    # Preemptions per second of CPU used, summed over threads: a busier server is preempted more in proportion
    # (four interleaved runs here: 230-290 per CPU second at 2, 4 and 6 requests/s), a hogged one far more (450-470).
    # The 0.05-core floor keeps a nearly idle server's handful of switches from reading as a large ratio.
    if f.involuntary_switches_per_second is None or f.cpu_per_second is None:
        return None
    return f.involuntary_switches_per_second / max(f.cpu_per_second, 0.05)


def _pressure(key: str) -> Callable[[Features], float | None]:
    # The server's own cgroup's stall (PSI), seconds per second; None where the kernel has none or before it was kept.
    return lambda f: None if f.pressure is None else f.pressure.get(key)


SIGNALS: tuple[Signal, ...] = (
    Signal("gc_pause", "gc", "GC pause", lambda f: f.gc_pause_per_second, 0.001, 0.005, "ms/s", 1000, "gc"),
    Signal("app_wait", "lock", "threads waiting inside their own code", lambda f: f.app_wait_threads,
           0.05, 0.2, "threads", 1, "stacks", per_tick=True),
    Signal("futex", "lock", "futex off-CPU", _futex, 0.05, 0.3, "s/s", 1, "offcpu"),
    Signal("blocked", "blocked", "off-CPU in sleep, disk I/O, stopped or other waits", _blocked, 0.01, 0.1, "s/s", 1,
           "offcpu"),
    # A second witness for the same label, from /proc: where the off-CPU probe cannot run (no root, no BPF), a
    # server stopped for 30 s was missed altogether without it (tests/scenarios/variants). Floor half a thread: one
    # thread caught in a disk wait is x2, all 35 stopped x70.
    Signal("stuck", "blocked", "threads stopped or in disk sleep at the window's end", lambda f: f.stuck_threads,
           0.5, 1.0, "threads", 1, "process", instant=True),
    Signal("syscalls", "syscalls", "syscalls per request", lambda f: f.syscalls_per_request, 10.0, 200.0, "/req", 1,
           "syscalls"),
    Signal("retransmits", "network", "TCP retransmits", lambda f: f.retransmits_per_second, 0.2, 1.0, "/s", 1, "tcp"),
    # What the network costs the clients, from the server's kernel (probes/delivery.py): the time from the reply's
    # last write to the client's ACK, and how many replies needed a retransmission or waited for an RTO. Floors: a
    # LAN's delivery is well under 10 ms; an RTO costs 200 ms at least, so a 100 ms rise of p99 is one.
    Signal("delivery_p99", "network", "replies delivered at p99 in", lambda f: f.delivery_p99_seconds, 0.01, 0.1, "s",
           1, "delivery"),
    Signal("delivery_mean", "network", "replies delivered on average in", lambda f: f.delivery_mean_seconds, 0.005,
           0.02, "ms", 1000, "delivery"),
    Signal("retransmitted_replies", "network", "share of replies retransmitted", lambda f: f.retransmitted_share,
           0.02, 0.05, "%", 100, "delivery"),
    Signal("rto_stall", "network", "RTO stalls", lambda f: f.rto_stall_per_second, 0.01, 0.1, "s/s", 1, "delivery"),
    # Connections whose SYN-ACK had to be resent: each waited a SYN-ACK timeout (1 s, then 2 s...) before its
    # request could leave. Floor 10 ms per request; a rise of 50 ms per request is one such wait in 20 requests.
    Signal("connect_wait", "network", "connection setup waiting for SYN-ACK retransmits",
           lambda f: f.connect_wait_per_request, 0.01, 0.05, "s/req", 1, "delivery"),
    # Fresh connections whose first request arrived 0.2-3.5 s after the handshake: a request lost on the way to the
    # server and resent after the client's RTO (a lost request is otherwise the client's alone to see). Floor 10 ms
    # per request; a rise of 10 ms per request is one 0.2 s resend in 20 requests. Not a decisive signal alone
    # (network_part.DIRECT), and judged from its baseline's high quantile (tail): a client that opens connections
    # shortly ahead of use reads the same, on a varying share of its connections.
    Signal("request_wait", "network", "first requests of fresh connections arriving late after the handshake",
           lambda f: f.request_wait_per_request, 0.01, 0.01, "s/req", 1, "delivery", tail=True),
    # The agent's own scrape as a probe of the path: a connection refused or timed out while the process lives
    # means nothing reaches its port (a partition drops every SYN, and with no connection open the server has
    # nothing to retransmit: a live 100 % drop read 0 retransmits and no other signal moved). A window is 1 or 0.
    Signal("unreachable", "network", "share of scrapes that could not connect to the server's port",
           lambda f: f.latency_unreachable, 0.05, 0.5, "", 1, "latency"),
    Signal("runqueue", "cpu_contention", "run-queue wait per CPU second", _runq_per_cpu, 0.05, 0.5, "s/s", 1,
           "runqueue"),
    Signal("involuntary", "cpu_contention", "involuntary context switches per CPU second", _involuntary_per_cpu,
           10.0, 100.0, "/CPU s", 1, "process"),
    Signal("cpu_per_token", "compute", "CPU per token", lambda f: f.cpu_per_token, 1e-4, 0.0005, "ms/token", 1000,
           "process"),
    # Memory: the server's cgroup stalled on memory (reclaim, refaults, swap-in), and its own pages read back from
    # disk. Floors: 1 % of the time stalled, 1 fault/s; a rise counts from 5 % of the time and 20 faults/s.
    Signal("memory_pressure", "memory", "memory stall of the server's cgroup (PSI some)", _pressure("memory_some"),
           0.01, 0.05, "s/s", 1, "pressure"),
    Signal("major_faults", "memory", "major page faults of the server", lambda f: f.major_faults_per_second, 1.0,
           20.0, "/s", 1, "pressure"),
    # A third witness of disk waits: the cgroup stalled on I/O even where the off-CPU probe cannot run.
    Signal("io_pressure", "blocked", "I/O stall of the server's cgroup (PSI some)", _pressure("io_some"), 0.01,
           0.1, "s/s", 1, "pressure"),
)

# Witnesses: read every window and kept in the baseline's rows beside the signals (so each has a median and a usual
# high), but not ranked as causes on their own. The CPU stall of the server's cgroup counts only beside a named
# neighbour (LatencyDetector._contention): where the server runs in the root cgroup it is the host's figure, which
# any busy neighbour raises, the server's latency moved or not. Floor 5 % of the time; a rise counts from 0.1 s/s.
WITNESSES: tuple[Signal, ...] = (
    Signal("cpu_pressure", "cpu_contention", "CPU stall of the server's cgroup (PSI some)", _pressure("cpu_some"),
           0.05, 0.1, "s/s", 1, "pressure"),
)

BY_NAME = {s.name: s for s in SIGNALS + WITNESSES}


def read_all(f: Features) -> dict[str, float | None]:
    """Every signal and witness of one window; a value that is not a finite number is unmeasured (None), never kept as NaN."""
    out: dict[str, float | None] = {}
    for s in SIGNALS + WITNESSES:
        v = s.read(f)
        out[s.name] = float(v) if v is not None and math.isfinite(v) else None
    return out
