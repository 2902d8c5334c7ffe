"""Outside CPU contention: two busy processes per CPU for SECONDS at PID's priority, all ended with this one."""

import os
import signal
import sys
import time


def main(seconds: float, pid: int | None = None, per_cpu: int = 2) -> int:
    if pid is not None:
        # Compete on equal terms with the server, whatever priority it was started at.
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, pid))
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
    sys.exit(main(float(sys.argv[1]), *(int(a) for a in sys.argv[2:4])))
