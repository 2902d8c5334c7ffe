"""Other tenants on the host: run COMMAND again and again, with a random pause after each run, for SECONDS.

A shared inference host runs other people's work beside the server: builds, test suites, batch jobs that come
and go. The suite's live run beside two of these loops is the shared-host condition the detector must stay quiet
in (their load is labelled normal) while still finding the injected faults. Each run's start and end go to the
log (one JSON object per line) so a false alarm can be laid beside what the neighbours were doing.

    python3 neighbours.py SECONDS MAX_PAUSE SEED LOG -- COMMAND...
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

from stop_request import StopRequest


def main(seconds: float, max_pause: float, seed: int, log_path: str, command: list[str]) -> int:
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    stop = StopRequest()
    with open(log_path, "a", encoding="utf-8") as log:
        while not stop.requested and time.monotonic() < deadline:
            started = time.time()
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
            while child.poll() is None and not stop.requested and time.monotonic() < deadline:
                time.sleep(0.5)
            if child.poll() is None:  # ended by the deadline or a signal: take its whole process group with it
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            log.write(json.dumps({"start": round(started, 3), "end": round(time.time(), 3),
                                  "rc": child.returncode}) + "\n")
            log.flush()
            pause = rng.uniform(0, max_pause)
            end_pause = time.monotonic() + pause
            while not stop.requested and time.monotonic() < min(end_pause, deadline):
                time.sleep(0.5)
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 7 or sys.argv[5] != "--":
        sys.exit(__doc__)
    sys.exit(main(float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[6:]))
