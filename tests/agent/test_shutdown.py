"""Every command stops cleanly: a closed pipe (`| head`), SIGTERM and SIGINT end it with its probes unloaded."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    yield proc
    proc.kill()
    proc.wait()


def _collect(pid: int) -> list[str]:
    return [sys.executable, "-m", "agent.cli", "collect", "--pid", str(pid), "--interval", "1", "--json",
            "--no-pyspy", "--probes", "syscalls"]


@pytest.mark.bpf
def test_collect_into_head_exits_when_the_pipe_closes(require_bpf, sleeper):
    # The shell's `| head -n 1`: head exits after one line and the pipe's read end closes. The process
    # exiting is what unloads its probes (their fds close); a global BPF program count would race
    # with other tests loading probes on the same kernel.
    shell = subprocess.run(f"{' '.join(_collect(sleeper.pid))} | head -n 1; echo \"rc=${{PIPESTATUS[0]}}\"",
                           shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60,
                           cwd=REPO)
    lines = shell.stdout.splitlines()
    assert json.loads(lines[0])["pid"] == sleeper.pid, shell.stdout
    assert lines[-1] == "rc=0", shell.stdout + shell.stderr
    assert "Broken pipe" not in shell.stderr and "Traceback" not in shell.stderr, shell.stderr


@pytest.mark.bpf
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_collect_stops_on_sigterm_and_sigint(require_bpf, sleeper, signum):
    proc = subprocess.Popen(_collect(sleeper.pid), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    assert proc.stdout.readline()  # probes loaded, one window out
    os.kill(proc.pid, signum)
    try:
        rc = proc.wait(timeout=20)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert rc in (0, 130) and "Traceback" not in err, err
