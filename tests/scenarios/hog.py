"""Outside CPU contention: PER_CPU busy processes per CPU for SECONDS at PID's priority plus NICE_OFFSET (negative:
a stronger competitor than the server), all ended with this one.

    python3 hog.py SECONDS [PID [PER_CPU [NICE_OFFSET [processes|threads]]]]

`threads`: the same number of busy threads in this one process instead (a batch job's worker threads), each
hashing a buffer with the interpreter lock released, so they run on every CPU at once. One process is one culprit
with one pid, the one a scenario records (`culprit = true`) for scoring to check that the cause names it.

`infersight eval` runs a phase's command in its own session. With the kernel's autogroup on (Debian's default,
/proc/sys/kernel/sched_autogroup_enabled), a session is one scheduling group: all the hog's processes together
get a fair share against the server's session, and their nice ranks them only against each other. So neither
PER_CPU nor NICE_OFFSET makes it take more than that share from the server (docs/BENCHMARKS.md, "How strong
must an outside hog be?"); run in the server's own session, they would.
"""

import hashlib
import os
import signal
import sys
import threading
import time


def spin(buffer: bytes) -> None:
    while True:
        hashlib.sha256(buffer).digest()  # releases the interpreter lock for buffers over 2 KiB


def main(seconds: float, pid: int | None = None, per_cpu: int = 2, nice_offset: int = 0,
         mode: str = "processes") -> int:
    if mode not in ("processes", "threads"):
        raise SystemExit(f"mode must be processes or threads, got {mode!r}")
    if pid is not None:
        # Compete with the server from its own priority, whatever it was started at (offset 0: equal terms).
        os.setpriority(os.PRIO_PROCESS, 0, max(-20, min(19, os.getpriority(os.PRIO_PROCESS, pid) + nice_offset)))
    if mode == "threads":
        buffer = os.urandom(1 << 20)
        for _ in range(per_cpu * (os.cpu_count() or 1)):
            threading.Thread(target=spin, args=(buffer,), daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # daemon threads: nothing to reap
        time.sleep(seconds)
        return 0
    children = []
    for _ in range(per_cpu * (os.cpu_count() or 1)):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            while True:
                pass
        children.append(pid)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        time.sleep(seconds)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        for pid in children:
            os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), *(int(a) for a in sys.argv[2:5]), *sys.argv[5:6]))
