"""`make demo`'s own safety: the admin token never on a command line, stale servers and busy ports named."""

import os
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import pytest

from agent import demo
from tests.conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"the workload at {url} did not come up within {timeout} s")


@pytest.mark.workload
def test_demo_server_token_is_in_a_0600_file_and_never_in_argv_or_environ(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    port = _free_port()
    os.chdir(REPO)
    token = "demo-secret-0123456789"
    server = demo.start_server(var, port, token)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url)
        argv = open(f"/proc/{server.pid}/cmdline", "rb").read()
        assert token.encode() not in argv, "the token is readable by every user in ps"
        # Nor in its environment, whose first copy /proc/PID/environ keeps for the server's whole life.
        assert token.encode() not in open(f"/proc/{server.pid}/environ", "rb").read()
        assert stat.S_IMODE(os.stat(var / "admin-token").st_mode) == 0o600
        assert (var / "admin-token").read_text().strip() == token
        fault = [sys.executable, "-m", "workload", "fault", "gc", "off", "--url", url]
        ok = subprocess.run([*fault, "--token-file", str(var / "admin-token")], capture_output=True, text=True,
                            cwd=REPO, timeout=30, env={k: v for k, v in os.environ.items()
                                                       if k != demo.ADMIN_TOKEN_ENV})
        assert ok.returncode == 0, ok.stderr
        # A token file others can read is refused with one line, before anything is sent.
        (var / "loose").write_text(token)
        os.chmod(var / "loose", 0o644)
        loose = subprocess.run([*fault, "--token-file", str(var / "loose")], capture_output=True, text=True,
                               cwd=REPO, timeout=30)
        assert loose.returncode == 2 and "chmod 600" in loose.stderr and "Traceback" not in loose.stderr
    finally:
        server.terminate()
        server.wait(timeout=20)


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def test_demo_names_a_busy_port_in_one_line(tmp_path, listener):
    run = subprocess.run([sys.executable, "-m", "agent.demo", "--var", str(tmp_path / "var"), "--port",
                          str(listener)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 1
    assert run.stderr.strip().count("\n") == 0 and f"port {listener} " in run.stderr, run.stderr
    assert f"by pid {os.getpid()}" in run.stderr and "--port" in run.stderr


def test_agent_on_a_busy_port_is_one_line_naming_it(tmp_path, listener):
    config = tmp_path / "infersight.toml"
    config.write_text(f'listen = "127.0.0.1:{listener}"\nstore_dir = "store"\n'
                      '[[targets]]\nname = "x"\npid = 1\n')
    os.chmod(tmp_path, 0o755)
    run = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"cannot listen on 127.0.0.1:{listener}: Address already in use" in run.stderr


def test_children_left_by_a_killed_demo_are_stopped_and_strangers_are_not(tmp_path):
    from agent import demo_guard

    var = tmp_path / "var"
    var.mkdir()
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        demo_guard.record_children(var, [(ours.pid, "workload")])
        # A recorded pid whose start time differs is a stranger that reused the pid.
        (var / demo_guard.PIDS_FILE).write_text((var / demo_guard.PIDS_FILE).read_text()
                                                + f"{stranger.pid} 1 load\n")
        said = demo_guard.stop_stale(var)
        assert said == [f"stopped the workload (pid {ours.pid}) left running by an earlier demo"]
        assert ours.wait(timeout=5) is not None and stranger.poll() is None
    finally:
        for p in (ours, stranger):
            p.kill()
            p.wait()


def test_demo_children_die_with_a_killed_demo():
    code = ("import subprocess, sys, time\nfrom agent.demo_guard import die_with_parent\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "preexec_fn=die_with_parent)\nprint(c.pid, flush=True)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    child = int(parent.stdout.readline())
    parent.kill()  # kill -9 of the demo
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    os.kill(child, 9)
    pytest.fail(f"child {child} outlived the killed demo")


def test_a_second_agent_on_the_same_store_refuses_in_one_line(tmp_path):
    from agent.config import Config, TargetSpec
    from agent.daemon import Agent
    from agent.pidlock import AlreadyRunning

    store = tmp_path / "store"
    first = Agent(Config(store_dir=store, listen=f"127.0.0.1:{_free_port()}",
                         targets=(TargetSpec(name="x", pid=1),)))
    try:
        with pytest.raises(AlreadyRunning, match=f"another infersight agent \\(pid {os.getpid()}\\) is using"):
            Agent(Config(store_dir=store, listen=f"127.0.0.1:{_free_port()}", targets=(TargetSpec(name="x", pid=1),)))
    finally:
        first.store.close()
        first.web.stop()
        first.lock.release()
    again = Agent(Config(store_dir=store, listen=f"127.0.0.1:{_free_port()}", targets=(TargetSpec(name="x", pid=1),)))
    again.store.close()
    again.web.stop()
    again.lock.release()
