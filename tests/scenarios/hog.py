"""Outside CPU contention: two busy processes per CPU for SECONDS, all ended with this one (SIGTERM too)."""

import os
import signal
import sys
import time


def main(seconds: float, per_cpu: int = 2) -> int:
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
    sys.exit(main(float(sys.argv[1]), *(int(a) for a in sys.argv[2:3])))
