"""The neighbours loop that loads a shared host in the live suite run: it repeats, logs every run, and leaves
nothing running when its time is up."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_neighbours_repeat_the_command_log_each_run_and_stop_on_time(tmp_path: Path) -> None:
    log, marks = tmp_path / "log.jsonl", tmp_path / "marks"
    started = time.monotonic()
    # Each run appends a mark; the second time round it starts a grandchild that sleeps past the loop's deadline
    # (only killing the whole process group ends that one) and waits for it.
    sleeper = f"sleep 30.{os.getpid()}"  # a command line no other process has, to look for afterwards
    cmd = ["bash", "-c", f'echo x >> {marks}; if [ $(wc -l < {marks}) -ge 2 ]; then {sleeper} & wait; fi; exit 3']
    subprocess.run([sys.executable, str(HERE / "neighbours.py"), "3", "0", "1", str(log), "--", *cmd], check=True,
                   timeout=20)
    assert time.monotonic() - started < 10  # the sleeping run was cut off at the deadline, not waited for
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) >= 2 and runs[0]["rc"] == 3 and runs[-1]["rc"] == -9, runs
    assert all(r["start"] <= r["end"] for r in runs)
    assert subprocess.run(["pgrep", "-fx", sleeper], capture_output=True).returncode == 1
