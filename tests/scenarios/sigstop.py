"""A process stopped and resumed from outside: SIGSTOP PID for STOP_MS of every PERIOD_MS, always resumed at exit."""

import os
import signal
import sys
import time


def main(pid: int, seconds: float, stop_ms: float = 150.0, period_ms: float = 500.0) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stop_ms / 1000)
            os.kill(pid, signal.SIGCONT)
            time.sleep((period_ms - stop_ms) / 1000)
    except ProcessLookupError:
        return 1
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), *(float(a) for a in sys.argv[3:5])))
