"""procstat.usage counts a process tree's CPU: its own, its live children's, and its reaped children's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks.procstat import ProcessGone, usage

# A parent that starts a child burning ~0.4 s of CPU, waits for it (reaped: its CPU moves into the
# parent's cutime), then starts a second one that keeps burning while it is read.
TREE = textwrap.dedent("""
    import subprocess, sys, time
    burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {}: pass\\n"
    subprocess.run([sys.executable, "-c", burn.format(0.4)])
    live = subprocess.Popen([sys.executable, "-c", burn.format(60)])
    print("ready", flush=True)
    time.sleep(60)
""")


def test_usage_sums_own_reaped_and_live_children() -> None:
    # Its own session, so the whole tree (the live burner too) goes with one killpg.
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        first = usage(proc.pid)
        # Poll rather than sleep a fixed time: on a busy host the burner gets the CPU when it gets it.
        deadline = time.monotonic() + 30
        while (second := usage(proc.pid)).live_children_cpu - first.live_children_cpu < 0.2:
            assert time.monotonic() < deadline, "the live child burned no CPU in 30 s"
            time.sleep(0.2)
        assert first.live_children == 1 and first.threads >= 1 and first.fds >= 3 and first.rss_bytes > 0
        assert first.reaped_children_cpu >= 0.3, first  # the first child, reaped
        assert second.total_cpu >= first.total_cpu
        assert second.peak_rss_bytes >= second.rss_bytes
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with pytest.raises(ProcessGone, match=str(proc.pid)):
        usage(proc.pid)
