"""CPUs taken away from outside: every thread of PID pinned to the CPUs in LIST (e.g. "0") for SECONDS.

What `taskset -a -p` or a cpuset change does to a running server. Each thread's own affinity is restored at exit.
"""

import os
import signal
import sys
import time


def parse_cpus(text: str) -> set[int]:
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise SystemExit(f"CPU list {text!r} is not like 0 or 0-3 or 0,2") from None
    unknown = cpus - os.sched_getaffinity(0)
    if not cpus or unknown:
        raise SystemExit(f"CPU list {text!r} names CPUs this process cannot use: {sorted(unknown)}")
    return cpus


def main(pid: int, seconds: float, cpu_list: str = "0") -> int:
    cpus = parse_cpus(cpu_list)
    before: dict[int, set[int]] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    deadline = time.monotonic() + seconds
    try:
        # Threads the server starts meanwhile inherit their creator's pinned affinity; check every second anyway.
        while time.monotonic() < deadline:
            for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                if tid not in before:
                    try:
                        before[tid] = os.sched_getaffinity(tid)
                        os.sched_setaffinity(tid, cpus)
                    except ProcessLookupError:
                        pass
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    except FileNotFoundError:
        return 1  # the server is gone
    finally:
        for tid, affinity in before.items():
            try:
                os.sched_setaffinity(tid, affinity)
            except ProcessLookupError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:4]))
