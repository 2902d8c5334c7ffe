"""CPU time of naming who wrote (agent/sources/disk_writers.py): one read of every process's /proc/PID/io and the
naming of the top writers, as a share of a core at one read per window (paid only while the target's I/O stalls).

Run: .venv/bin/python -m tests.agent.bench_disk_writers [--reads N] [--interval SECONDS]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from agent.sources.disk_writers import WriteTracker, scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--interval", type=float, default=5.0, help="window length: one read per stalled window")
    args = parser.parse_args()
    processes = len(scan(Path("/proc")))
    tracker = WriteTracker()
    times = []
    for _ in range(args.reads):
        start = time.process_time()
        tracker.writers([os.getpid()])
        times.append(time.process_time() - start)
    times.sort()
    median, p90 = statistics.median(times), times[int(0.9 * (len(times) - 1))]
    print(f"{args.reads} reads, {processes} processes readable: {median * 1e3:.2f} ms CPU per read (median; p90 "
          f"{p90 * 1e3:.2f} ms, {median / max(processes, 1) * 1e6:.1f} us per process); one read per "
          f"{args.interval:g} s window: {100 * median / args.interval:.4f} % of a core while the I/O stalls, a "
          f"reference every 60 s: {100 * median / 60:.4f} %")


if __name__ == "__main__":
    main()
