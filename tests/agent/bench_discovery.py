"""Measure one discovery scan with many other users' processes carrying 64 KiB command lines.

Run as root: `.venv/bin/python -m tests.agent.bench_discovery --processes 200 --scans 30`. Starts the
processes as `nobody`, each `sleep` with a 64 KiB argv, times `discover()` with a `process_regex` spec
and `allowed_users` = root (what the daemon runs), and prints the median and the CPU per scan.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import time

from agent.config import TargetSpec
from agent.targets import discover

NOBODY = 65534


def spawn(count: int) -> list[subprocess.Popen]:
    # argv of 64 KiB: the most discovery reads of one command line (CMDLINE_MAX_BYTES).
    filler = ["x" * 1023] * 64
    # `; :` keeps sh from exec'ing sleep in its place: sh stays, with the long argv.
    return [subprocess.Popen(["sh", "-c", "sleep 600; :", "sh", *filler], user=NOBODY, group=NOBODY,
                             extra_groups=[], start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for _ in range(count)]


def measure(scans: int) -> dict[str, float]:
    # A pattern that must read every command line to the end to fail: the worst case for the old order.
    spec = TargetSpec(name="t", process_regex=re.compile(r"no-such-server-\d+$").pattern)
    walls, cpus = [], []
    for _ in range(scans):
        w0, c0 = time.perf_counter(), time.process_time()
        discover([spec], allowed_uids=frozenset({0}))
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"median_wall_ms": round(statistics.median(walls) * 1e3, 2),
            "median_cpu_ms": round(statistics.median(cpus) * 1e3, 2),
            "min_wall_ms": round(min(walls) * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--scans", type=int, default=30)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_discovery: run as root (it starts processes as nobody)")
    base = measure(args.scans)
    procs = spawn(args.processes)
    try:
        time.sleep(1)
        processes = len([name for name in os.listdir("/proc") if name.isdigit()])
        loaded = measure(args.scans)
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(json.dumps({"processes": processes, "without_them": base,
                      f"with_{args.processes}_of_nobody": loaded}))


if __name__ == "__main__":
    main()
