"""CPU throttling from outside the server: PID's threads moved into a cgroup capped at PERCENT% of one CPU (root).

What a container limit or a neighbour's cgroup policy does to a server: it runs, but only in short slices of each
100 ms period. cgroup v2 (`cpu.max`) when the hierarchy has the cpu controller, else cgroup v1
(`cpu.cfs_quota_us`). Every thread goes back to its own cgroup at exit and the new cgroup is removed.
"""

import os
import signal
import sys
import time

from cgroup import moved_into

PERIOD_US = 100_000


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def main(pid: int, seconds: float, percent: float = 30.0) -> int:
    limit = 100 * (os.cpu_count() or 1)
    if not 0 < percent <= limit:
        raise SystemExit(f"percent must be within 0..{limit} (of one CPU), got {percent}")
    quota_us = int(PERIOD_US * percent / 100)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with moved_into(pid, "cpu", "cpu.max", f"infersight_eval_quota_{pid}") as (path, hierarchy):
        if hierarchy.version == "v2":
            write(f"{path}/cpu.max", f"{quota_us} {PERIOD_US}")
        else:
            write(f"{path}/cpu.cfs_period_us", str(PERIOD_US))
            write(f"{path}/cpu.cfs_quota_us", str(quota_us))
        hierarchy.move(pid, path)
        time.sleep(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), *(float(a) for a in sys.argv[3:4])))
