"""ProcessHandle and ExitWatcher against real processes: identity by start time, exit seen at once."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from analysis.errors import TargetGone
from probes.pidfd import ExitWatcher, ProcessHandle, read_start_time, read_uids


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def test_a_held_process_is_alive_until_it_exits_even_as_an_unreaped_zombie() -> None:
    proc = _sleeper()
    handle = ProcessHandle.open(proc.pid, read_start_time(proc.pid))
    try:
        assert handle.alive() and handle.start_time == read_start_time(proc.pid)
        handle.check()
        proc.kill()
        deadline = time.monotonic() + 10
        while handle.alive():
            assert time.monotonic() < deadline, "the pidfd never reported the exit"
            time.sleep(0.01)
        # Not reaped yet: /proc/PID still exists (a zombie), which is why existence is no liveness test.
        assert os.path.exists(f"/proc/{proc.pid}")
        with pytest.raises(TargetGone, match="exited"):
            handle.check()
    finally:
        proc.kill()
        proc.wait()
        handle.close()
    assert not handle.alive()  # closed: never alive again


def test_a_wrong_start_time_means_the_pid_names_another_process() -> None:
    proc = _sleeper()
    try:
        with pytest.raises(TargetGone, match="names another process"):
            ProcessHandle.open(proc.pid, read_start_time(proc.pid) - 1)
        with pytest.raises(TargetGone, match="names another process"):
            ProcessHandle.open(proc.pid, 0)
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(TargetGone):
        ProcessHandle.open(proc.pid)  # reaped: nothing holds the pid (unless reused, then the start time differs)


def test_a_zombie_cannot_be_held() -> None:
    proc = _sleeper()
    proc.kill()
    while not open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
        time.sleep(0.01)
    try:
        with pytest.raises(TargetGone, match="exited"):
            ProcessHandle.open(proc.pid)
    finally:
        proc.wait()


def test_uids_are_read_from_status() -> None:
    me = os.getuid()
    assert read_uids(os.getpid()) == (me, os.geteuid(), me, me)
    with pytest.raises(TargetGone):
        read_uids(2**22 + 1)


def test_the_watcher_reports_an_exit_at_once_and_an_unwatched_one_never() -> None:
    fired: list[int] = []
    seen = threading.Event()

    def on_exit(handle: ProcessHandle) -> None:
        fired.append(handle.pid)
        seen.set()

    watched, unwatched = _sleeper(), _sleeper()
    handles = [ProcessHandle.open(p.pid) for p in (watched, unwatched)]
    watcher = ExitWatcher(on_exit)
    try:
        for h in handles:
            watcher.watch(h)
        watcher.unwatch(handles[1])
        unwatched.kill()
        unwatched.wait()
        killed_at = time.monotonic()
        watched.kill()
        assert seen.wait(10), "no exit reported"
        assert time.monotonic() - killed_at < 5
        time.sleep(0.2)  # an unwatched exit would have been reported by now too
        assert fired == [watched.pid]
    finally:
        watcher.close()
        for p in (watched, unwatched):
            p.kill()
            p.wait()
        for h in handles:
            h.close()
