"""The outside hog the scenarios run: its busy children compete at the server's priority plus the offset asked
for, there are PER_CPU of them per CPU, and none outlives it."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

HOG = Path(__file__).resolve().parent / "hog.py"


def _hog_children(hog: subprocess.Popen, want: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 10
    while len(kids := psutil.Process(hog.pid).children()) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return kids


def test_the_hog_runs_per_cpu_children_at_the_servers_priority_plus_the_offset_and_reaps_them():
    server = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: os.nice(5))  # niced before Popen returns
    hog = None
    try:
        assert psutil.Process(server.pid).nice() == 5
        hog = subprocess.Popen([sys.executable, str(HOG), "2", str(server.pid), "1", "3"])
        kids = _hog_children(hog, os.cpu_count() or 1)
        assert len(kids) == (os.cpu_count() or 1)
        assert {k.nice() for k in kids} == {8}  # the server's 5 plus the offset 3
        pids = [k.pid for k in kids]
        assert hog.wait(timeout=10) == 0
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    finally:
        for p in (server, hog):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_the_hog_in_threads_is_one_process_of_per_cpu_busy_threads_per_cpu():
    server = subprocess.Popen(["sleep", "30"])
    hog = subprocess.Popen([sys.executable, str(HOG), "4", str(server.pid), "1", "0", "threads"])
    try:
        proc = psutil.Process(hog.pid)
        want = os.cpu_count() or 1
        deadline = time.monotonic() + 10
        while proc.num_threads() < want + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.num_threads() == want + 1 and not proc.children()  # the main thread sleeps; no child process
        before = sum(proc.cpu_times()[:2])
        time.sleep(1.5)
        assert sum(proc.cpu_times()[:2]) - before > 0.3  # busy, on a host shared with others
        assert hog.wait(timeout=10) == 0
    finally:
        for p in (server, hog):
            if p.poll() is None:
                p.kill()
                p.wait()
