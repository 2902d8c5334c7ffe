"""Every command stops cleanly: a closed pipe (`| head`), SIGTERM and SIGINT end it with its probes unloaded."""

import json
import os
import signal
import subprocess
import sys
import time

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


def default_sigint() -> None:
    """In the child: SIGINT back to its default. A test run started in the background (`make test &`, nohup)
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: the child would not see Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.bpf
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_collect_stops_on_sigterm_and_sigint(require_bpf, sleeper, signum):
    proc = subprocess.Popen(_collect(sleeper.pid), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, preexec_fn=default_sigint)
    assert proc.stdout.readline()  # probes loaded, one window out
    os.kill(proc.pid, signum)
    try:
        rc = proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.wait()  # reaped: a hung one must not stay behind as a zombie child of the test run
    err = proc.stderr.read()
    assert rc in (0, 130) and "Traceback" not in err, err


@pytest.mark.root
def test_live_flamegraph_stops_on_sigterm_and_leaves_no_py_spy(require_root, tmp_path):
    import psutil

    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    out = tmp_path / "live.svg"
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "flamegraph", "--pid", str(sleeper.pid),
                             "--duration", "60", "-o", str(out)], stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        def cmdline(p: psutil.Process) -> str:
            try:
                return " ".join(p.cmdline())
            except psutil.Error:  # a wrapper that exited (a zombie until reaped) or is gone: not py-spy
                return ""

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
                "py-spy" in cmdline(c) for c in psutil.Process(proc.pid).children(recursive=True)):
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=15)
        err = proc.stderr.read()
        assert rc == 130 and "Traceback" not in err and not out.exists(), err
        time.sleep(1.5)  # a py-spy segment in flight ends within its 1 s
        left = [p for p in psutil.process_iter(["cmdline"]) if str(sleeper.pid) in (p.info["cmdline"] or [])
                and "py-spy" in " ".join(p.info["cmdline"] or [])]
        assert not left, f"py-spy still running after the command stopped: {left}"
    finally:
        proc.kill()
        sleeper.kill()
        sleeper.wait()


def test_stored_flamegraph_into_head_exits_cleanly(tmp_path):
    from agent.store import Store
    from analysis.window import StackReading, Window

    with Store.open(tmp_path / "store") as store:
        store.add_window(Window(target="server", pid=7, start=0, end=5, stacks=StackReading(
            active={f"main;frame_{i};leaf_{i}": i + 1 for i in range(20_000)})))
    shell = subprocess.run(f"{sys.executable} -m agent.cli flamegraph --store {tmp_path / 'store'} --target server "
                           f"--from 0 --to 10 --format folded | head -n 1; echo \"rc=${{PIPESTATUS[0]}}\"",
                           shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60,
                           cwd=REPO)
    assert shell.stdout.splitlines()[-1] == "rc=0", shell.stdout[-300:] + shell.stderr
    assert shell.stderr == "", shell.stderr


@pytest.mark.bpf
def test_collect_says_how_its_target_ended(require_bpf):
    victim = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    proc = subprocess.Popen(_collect(victim.pid), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    try:
        assert proc.stdout.readline()  # probes loaded, one window out
        subprocess.run(["kill", "-KILL", str(victim.pid)], check=True)
        victim.wait()
        rc = proc.wait(timeout=30)
    finally:
        for p in (proc, victim):
            p.kill()
            p.wait()
    err = proc.stderr.read()
    assert rc == 0 and f"infersight: pid {victim.pid} killed by SIGKILL (signal 9) from pid " in err, err
