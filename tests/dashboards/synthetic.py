"""A store filled with synthetic windows (steady, then a regression), for the page's browser tests and benchmarks."""

from __future__ import annotations

import random
from pathlib import Path

from agent.store import Store
from analysis.regression import Cause, FunctionShift, Regression
from analysis.window import (
    GcReading,
    LatencyReading,
    Log2Histogram,
    OffCpuReading,
    ProcessReading,
    RunQueueReading,
    StackReading,
    SyscallReading,
    TcpReading,
    Window,
)

HOSTILE = '<script>window.__xss=1</script>"onerror="window.__xss=2'
HOSTILE_FRAME = f'<img src=x onerror="window.__xss=3">{HOSTILE} (evil.py:1)'


def window(target: str, start: float, interval: float, slow: bool, rng: random.Random) -> Window:
    p50 = (0.09 if slow else 0.05) + rng.random() * 0.005
    active = {"serve (server.py:10);step (engine.py:40);decode (model.py:88)": 30 + (40 if slow else 0),
              "serve (server.py:10);step (engine.py:40);tokenize (tok.py:12)": 10,
              f"serve (server.py:10);{HOSTILE_FRAME}": 3}
    return Window(
        target=target, pid=4242, start=start, end=start + interval,
        syscalls=SyscallReading(counts={"futex": rng.randint(100, 200), "read": rng.randint(10, 40),
                                        "epoll_wait": rng.randint(5, 20)}),
        offcpu=OffCpuReading(seconds=2.0 + rng.random(), stacks={"schedule;futex_wait_queue": 800}),
        gc=GcReading(collections=rng.randint(0, 3), pause_seconds=(0.02 if slow else 0.002) * rng.random(),
                     max_pause_seconds=0.004, histogram=Log2Histogram(unit="us", counts=[0] * 10 + [2])),
        tcp=TcpReading(retransmits=rng.randint(0, 1)),
        runqueue=RunQueueReading(histogram=Log2Histogram(unit="us", counts=[5, 10, 2]),
                                 total_seconds=0.001 * rng.random()),
        process=ProcessReading(cpu_seconds=interval * (0.6 + 0.2 * rng.random()), rss_bytes=300 * 2**20, threads=9),
        latency=LatencyReading(p50_seconds=p50, p95_seconds=p50 * 1.8, p99_seconds=p50 * 2.4, requests=40,
                               request_rate=8.0 + rng.random()),
        stacks=StackReading(active=active, idle={"serve (server.py:10);wait (queue.py:5)": 12}, rate_hz=49.0,
                            samples=sum(active.values()) + 12),
    )


def regression(target: str, opened_at: float, closed_at: float | None = None) -> Regression:
    return Regression(id=f"{target}-{opened_at:.0f}", target=target, pid=4242, opened_at=opened_at,
                      closed_at=closed_at, severity="critical", score=8.5, baseline_start=opened_at - 1800,
                      baseline_end=opened_at - 60,
                      causes=[Cause("gc", 6.0, "GC pause 10 ms/s vs 1 ms/s baseline (x10)", 0.01, 0.001),
                              Cause("compute", 1.5, f"CPU per token up in {HOSTILE}")],
                      functions=[FunctionShift(f"decode {HOSTILE}", 0.3, 0.55)])


def fill(directory: Path, now: float, seconds: float, interval: float = 5.0, target: str = "server",
         slow_from: float | None = None) -> Store:
    """Windows of `target` ending at `now`, back to back over `seconds`; slower (a regression) from `slow_from`."""
    store = Store.open(directory)
    # Test data only: fsync per window would make a synthetic week take minutes.
    store._write.execute("PRAGMA synchronous=OFF")
    rng = random.Random(1)
    n = int(seconds // interval)
    for i in range(n):
        start = now - (n - i) * interval
        store.add_window(window(target, start, interval, slow_from is not None and start >= slow_from, rng))
    store._write.execute("PRAGMA synchronous=FULL")
    return store
