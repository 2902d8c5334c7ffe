"""SIGKILL the engine process of the workload server PID (`serve --engine-process`), as the OOM killer would, then
wait up to SECONDS for the server to start a new one. Exit 0 when it did; 1 (and why, on stderr) when PID has no
engine child or no new one came."""

import os
import signal
import sys
import time
from pathlib import Path

TITLE = b"infersight::EngineCore"


def engine_children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if Path(f"/proc/{child}/cmdline").read_bytes().startswith(TITLE):
                    found.append(int(child))
            except FileNotFoundError:
                continue  # ended while we looked
    return found


def main(pid: int, seconds: float) -> int:
    engines = engine_children(pid)
    if len(engines) != 1:
        print(f"kill_engine: server {pid} has {len(engines)} engine processes ({engines}), expected one", file=sys.stderr)
        return 1
    os.kill(engines[0], signal.SIGKILL)
    print(f"kill_engine: SIGKILLed engine process {engines[0]} of server {pid}", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        new = [e for e in engine_children(pid) if e != engines[0]]
        if new:
            print(f"kill_engine: server {pid} started engine process {new[0]}", flush=True)
            return 0
        time.sleep(0.2)
    print(f"kill_engine: server {pid} started no new engine within {seconds:g}s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2])))
