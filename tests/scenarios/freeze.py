"""A process frozen and thawed from outside through its cgroup: FREEZE_MS of every PERIOD_MS for SECONDS (root).

What `docker pause` / `docker unpause` (the cgroup freezer) does to a server. Unlike SIGSTOP the process gets no
signal and cannot tell. cgroup v2 (`cgroup.freeze`) where there is a v2 hierarchy, else the v1 freezer. Thawed and
moved back to its own cgroup at exit.
"""

import signal
import sys
import time

from cgroup import moved_into


def main(pid: int, seconds: float, freeze_ms: float = 1000.0, period_ms: float = 3000.0) -> int:
    if not 0 < freeze_ms < period_ms:
        raise SystemExit(f"FREEZE_MS must be within 0..PERIOD_MS ({period_ms}), got {freeze_ms}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with moved_into(pid, "freezer", "cgroup.freeze", f"infersight_eval_freeze_{pid}") as (path, hierarchy):
        state_file, frozen, thawed = ((f"{path}/cgroup.freeze", "1", "0") if hierarchy.version == "v2"
                                      else (f"{path}/freezer.state", "FROZEN", "THAWED"))

        def set_state(value: str) -> None:
            with open(state_file, "w") as f:
                f.write(value)

        hierarchy.move(pid, path)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                set_state(frozen)
                time.sleep(freeze_ms / 1000)
                set_state(thawed)
                time.sleep((period_ms - freeze_ms) / 1000)
        finally:
            set_state(thawed)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), *(float(a) for a in sys.argv[3:5])))
